"""``run``: one request about one image, answered in one place, and the stages it is made of.

The entry points (the CLI's ``analyze``, ``explain``, the app's events and export) call these functions; none of them
writes the workflow again. ``run`` answers a whole ``Request``: it analyses the image, gives a backbone its similarity
target (``retarget``) and a CLIP-like model its prompts as classes (``targets.prompt_model``), computes the target's
evidence and every map asked for (AttnLRP and LeGrad too, as tensors), and the score, scoreboard, sanity check,
ablation, norms and decomposition that were asked for, and puts them together as a ``Run`` (``answer``), which holds no
model. The app runs the same stages one event at a time and keeps what they return on its session: an upload is
``analyse`` then ``evidence``; a target chosen is ``evidence`` (or ``retarget``); a button is ``score``, ``rank``,
``check``, ``ablate``, ``patch`` or ``match``; the Compare tab's second side is ``second_side``; the export is
``answer`` of what the page shows. Each long stage reports through one ``Progress`` callback, which says what it costs
before it starts.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from PIL import Image

from vit_explorer.core import maps
from vit_explorer.core.analysis import (
    DEFAULT_MEMORY_BUDGET,
    MODEL_MAPS,
    Analysis,
    ClassEvidence,
    Prediction,
    analyze,
    choose_storage,
    class_evidence,
    map_bytes,
    memo,
    pixels_of,
    queries_and_keys,
    recompute_query_rows,
)
from vit_explorer.core.capture import InputsSink, capture
from vit_explorer.core.comparison import Match, target_b
from vit_explorer.core.curves import (
    BLUR,
    DEFAULT_RANDOM_ORDERS,
    DEFAULT_STEPS,
    FaithfulnessCurves,
    Protocol,
    SanityCurves,
    forward_passes,
)
from vit_explorer.core.decomposition import Decomposition
from vit_explorer.core.head_atlas import Atlas
from vit_explorer.core.images import ImageSource, load_image, model_view, to_pixels
from vit_explorer.core.interventions import HeadAblation, Patching, patching_passes
from vit_explorer.core.query_key_embedding import JointEmbedding, joint_embedding, sample_embedding
from vit_explorer.core.ranking import Scoreboard
from vit_explorer.core.register_neurons import RegisterNeurons
from vit_explorer.core.request import Request, Run
from vit_explorer.core.statistics import DatasetStatistics
from vit_explorer.core.targets import OtherImage, Target, prompt_model, similarity_model
from vit_explorer.core.token_norms import TokenNorms
from vit_explorer.draw import words
from vit_explorer.errors import VitExplorerError
from vit_explorer.methods import ablation as ablations
from vit_explorer.methods import atlas as atlas_method
from vit_explorer.methods import dataset, evaluation, faithfulness, norms, patching, scoreboard, text_bank
from vit_explorer.methods import registers as register_method
from vit_explorer.methods.sanity import sanity_check
from vit_explorer.models import load_model
from vit_explorer.models.base import LoadedModel

if TYPE_CHECKING:  # the images as the model saw them, which draw reads; run itself does no numpy
    import numpy as np

# a long stage about to start: (what it does and costs, in words; how many steps; what a step is) → called after each
# step; a stage of 0 steps is a line to show
Progress = Callable[[str, int, str], Callable[[], None]]


def silent(description: str, total: int, unit: str) -> Callable[[], None]:
    return lambda: None


def analyse(model: LoadedModel, image: ImageSource, *, name: str | None = None,
            memory_budget: int = DEFAULT_MEMORY_BUDGET, fit: str = "stretch", explain: bool = True,
            decompose: bool = False) -> Analysis:
    """An upload: one forward pass of ``image`` through ``model``, every layer's attention kept (``analysis.analyze``); with
    ``explain`` the top class's evidence from the same pass's backward, and with ``decompose`` its decomposition too."""
    return analyze(model, image, name=name, memory_budget=memory_budget, fit=fit, explain=explain, decompose=decompose)


def evidence(model: LoadedModel, analysis: Analysis, target: int | str | None = None, methods: Iterable[str] = (), *,
             decompose: bool = False) -> ClassEvidence | None:
    """The gradient evidence of ``target`` (default: the top class; None for a model without classes), with the maps of
    ``methods`` that take passes of their own (AttnLRP, LeGrad) and with ``decompose`` the decomposition: one forward and
    one backward pass, none for what the analysis keeps already (``analysis.class_evidence``)."""
    if not analysis.num_classes:
        return None
    return class_evidence(model, analysis, target, tuple(methods), decompose=decompose)


def query_rows(model: LoadedModel, analysis: Analysis, token: int) -> None:
    """Make every head's row of the query ``token`` readable off the analysis: a compact analysis kept no patch query's
    rows, which then cost one forward pass (``analysis.recompute_query_rows``); nothing where they are kept."""
    if not analysis.store.keeps_rows_of(token):
        recompute_query_rows(model, analysis, token)


def retarget(model: LoadedModel, analysis: Analysis, target: Target, memory_budget: int = DEFAULT_MEMORY_BUDGET,
             fit: str = "stretch", decompose: bool = False) -> tuple[LoadedModel, Analysis, int | str | None]:
    """The model, analysis and class that ``target`` is explained with: as they are for a classifier; for a backbone, its
    similarity model (``targets.similarity_model``: one score, the similarity of the image's embedding to its own, of the
    patch's token to its own, or of the embedding to a second image's, fitted by ``fit`` as the first was) and the
    analysis of the same image through it, whose one "class" is 0 (with ``decompose``, its decomposition too)."""
    target.check(model)
    if model.num_classes:
        return model, analysis, target.value
    other = target.other
    second = None if other is None else (to_pixels(model_view(load_image(other.source, other.name), model.preprocess, fit),
                                                    model.preprocess), other.name)
    similarity = similarity_model(model, pixels_of(model, analysis), target.patch, second)
    # the image as the model saw it, fitted already: analysing it again fits nothing
    return similarity, analyze(similarity, Image.fromarray(analysis.image), memory_budget=memory_budget, decompose=decompose), 0


def second_side(model: LoadedModel, image: ImageSource, main: Analysis, main_target: int | None, *,
                name: str | None = None, memory_budget: int = DEFAULT_MEMORY_BUDGET, fit: str = "stretch",
                analysis: Analysis | None = None) -> tuple[Analysis, ClassEvidence | None]:
    """A comparison's second side (B) of ``main`` (A): ``image`` analysed by ``model`` (or the ``analysis`` of it kept
    from before), with the evidence of the class A's target names on B (``comparison.target_b``; its top class where the
    two models' classes differ): no pass beyond B's upload pass for B's top class."""
    if analysis is None:
        analysis = analyse(model, image, name=name, memory_budget=memory_budget, fit=fit)
    target = target_b(main, analysis, main_target)
    return analysis, None if target is None else class_evidence(model, analysis, target)


def match(model: LoadedModel, a: Analysis, b: Analysis, name_a: str, name_b: str, *,
          memory_budget: int = DEFAULT_MEMORY_BUDGET, progress: Progress = silent) -> Match:
    """Why two images match by one backbone: A's embedding explained on B's direction and B's on A's (``core.targets``:
    another image), each with every map that takes passes of its own. Per side: a pass for the other's embedding, one
    for the similarity's analysis, and one forward and backward pass per map method."""
    step = progress("why A and B match: each embedding explained on the other's direction", 2, "side")
    sides = []
    for analysis, other in ((a, OtherImage(Image.fromarray(b.image), name_b)), (b, OtherImage(Image.fromarray(a.image), name_a))):
        similarity, retargeted, _ = retarget(model, analysis, Target(other), memory_budget)
        sides += [retargeted, class_evidence(similarity, retargeted, 0, tuple(MODEL_MAPS))]
        step()
    return Match(*sides, weakref.ref(a))


def score(model: LoadedModel, analysis: Analysis, evidence: ClassEvidence, method: str, protocol: Protocol, *,
          options: maps.RolloutOptions = maps.RolloutOptions(), steps: int = DEFAULT_STEPS,
          random_orders: int = DEFAULT_RANDOM_ORDERS, progress: Progress = silent) -> FaithfulnessCurves:
    """The faithfulness curves of ``method``'s map for the evidence's target (``faithfulness.deletion_insertion``)."""
    evidence = class_evidence(model, analysis, evidence.target, (method,))
    total = faithfulness.batches(steps, random_orders, protocol=protocol)
    step = progress(f"scoring the {method} map: {protocol.description}, "
                    f"{forward_passes(steps, random_orders, protocol)} forward passes", total, "batch")
    return faithfulness.deletion_insertion(model, analysis.image, maps.class_map(analysis, method, evidence, options),
                                           evidence.target,
                                           steps=steps, random_orders=random_orders, protocol=protocol, step=step)


def rank(model: LoadedModel, analysis: Analysis, evidence: ClassEvidence, protocol: Protocol, *,
         options: maps.RolloutOptions = maps.RolloutOptions(), progress: Progress = silent) -> Scoreboard:
    """Every method ranked for the evidence's target (``scoreboard.scoreboard``)."""
    total = scoreboard.batches(len(maps.CLASS_METHODS), protocol=protocol) + analysis.map_shape[0]
    step = progress(f"scoreboard: {len(maps.CLASS_METHODS)} methods ranked by {protocol.description}, each against chance and "
                    "the randomised model", total, "step")
    return scoreboard.scoreboard(model, analysis, evidence.target, protocol=protocol, options=options, step=step)


def check(model: LoadedModel, analysis: Analysis, evidence: ClassEvidence | None, *,
          options: maps.RolloutOptions = maps.RolloutOptions(), progress: Progress = silent) -> SanityCurves:
    """The cascading randomisation check of every map (``sanity.sanity_check``)."""
    layers = analysis.map_shape[0]
    step = progress(f"sanity check: randomising the model's {layers} layers from the top, one more per pass", layers, "layer")
    return sanity_check(model, analysis, None if evidence is None else evidence.target, options=options, step=step)


def ablate(model: LoadedModel, analysis: Analysis, evidence: ClassEvidence, mode: str, *,
           progress: Progress = silent) -> HeadAblation:
    """Each head removed in turn (``methods.ablation``), kept on the analysis."""
    layers, heads = analysis.map_shape
    step = progress(f"head ablation ({mode}): each head removed in turn, {words.ablation_cost(layers, heads)}", layers, "layer")
    return ablations.ablation_of(model, analysis, evidence.target, mode, step=step)


def kept_ablation(analysis: Analysis, target: int, mode: str) -> HeadAblation | None:
    """The ablation of ``target`` in ``mode`` where ``ablate`` ran it on this analysis; None where it has not."""
    return ablations.kept_ablation(analysis, target, mode)


def prediction_without(model: LoadedModel, analysis: Analysis, heads: Iterable[tuple[int, int]], mode: str,
                       k: int = 5) -> list[Prediction]:
    """The top ``k`` of the analysis's image with ``heads`` (layer, head) removed in ``mode``: one forward pass."""
    return ablations.prediction_without(model, pixels_of(model, analysis), list(heads), k=k, mode=mode)


def patch(model: LoadedModel, a: Analysis, b: Analysis, target: int, *, tokens: bool,
          progress: Progress = silent) -> Patching:
    """B patched into A for A's ``target``, by one model: each head's output at each layer, and with ``tokens`` the
    stream after each layer at each token, taken from B in turn (``methods.patching``)."""
    layers = a.map_shape[0]
    step = progress(f"patching B into A: {words.passes(patching_passes(*model.map_shape, model.layout.num_tokens, tokens))}",
                    layers * (2 if tokens else 1), "layer pass")
    return patching.patch(model, pixels_of(model, a), pixels_of(model, b), target, a.label(target), tokens=tokens, step=step)


def answer_split(model: LoadedModel, image: ImageSource, *, memory_budget: int = DEFAULT_MEMORY_BUDGET,
                 fit: str = "stretch") -> tuple[Analysis, Decomposition]:
    """One image's answer (its top class, or a backbone's own embedding) split over the model's parts, each head's share
    over the patches it writes from too: one forward and backward pass (the head atlas's top images)."""
    analysis = analyse(model, image, memory_budget=memory_budget, fit=fit, decompose=True)
    if not analysis.num_classes:
        model, analysis, _ = retarget(model, analysis, Target(), memory_budget, fit, decompose=True)
    return analysis, decompose(evidence(model, analysis, decompose=True))


def check_head(map_shape: tuple[int, int], layer: int, head: int) -> None:
    """Refuse a (``layer``, ``head``) that is not one of a model of ``map_shape`` (layers, heads)."""
    layers, heads = map_shape
    if not (0 <= layer < layers and 0 <= head < heads):
        raise VitExplorerError(f"layer {layer}, head {head} is not one of this model's {layers} layers × {heads} heads")


def query_key_embedding(model: LoadedModel, analysis: Analysis, layer: int, head: int,
                        projection: str = "pca") -> JointEmbedding:
    """One head's queries and keys in one 2-D embedding (``core.query_key_embedding``), memoised on the analysis; the
    queries and keys come from the analysis, or from one fused forward pass where it kept its maps whole."""
    check_head(analysis.map_shape, layer, head)
    inputs = queries_and_keys(model, analysis)
    bias = inputs.biases[layer]  # broadcastable to [heads, n, n]
    heads, tokens = inputs.queries.shape[1], inputs.queries.shape[-2]
    head_bias = None if bias is None else torch.broadcast_to(bias, (heads, tokens, tokens))[head]
    return memo(analysis, ("query-key embedding", layer, head, projection),
                lambda: joint_embedding(inputs.queries[layer, head], inputs.keys[layer, head], projection, bias=head_bias))


def query_key_sample(model: LoadedModel, source: str | Path, layer: int, head: int, *, count: int = 8,
                     projection: str = "pca", fit: str = "stretch") -> tuple[JointEmbedding, list[str], list[np.ndarray]]:
    """One head's queries and keys over ``count`` images of ``source`` (evenly spaced through its sorted list) in one
    embedding (``core.query_key_embedding.sample_embedding``), with each image's name and the image as the model saw it
    (``[H, W, 3]`` uint8, for the patch colours); one fused forward pass of them all."""
    check_head(model.map_shape, layer, head)
    paths = dataset.list_images(source).paths
    chosen = [paths[index * len(paths) // min(count, len(paths))] for index in range(min(count, len(paths)))]
    views = [model_view(load_image(path), model.preprocess, fit) for path in chosen]
    pixels = torch.cat([to_pixels(view, model.preprocess) for view in views]).to(model.device)
    inputs = capture(model, pixels, InputsSink(model.map_shape[0])).kept  # one QueriesKeys per image
    embedding = sample_embedding(torch.stack([image.queries[layer, head] for image in inputs]),
                                 torch.stack([image.keys[layer, head] for image in inputs]), projection)
    return replace(embedding, biased=inputs[0].biases[layer] is not None), [path.name for path in chosen], views


def token_norms(analysis: Analysis) -> TokenNorms:
    """Every layer's token norms and their high-norm patches, with the attention they draw; no pass
    (``methods.norms``)."""
    return norms.for_analysis(analysis)


def norm_peak_layer(analysis: Analysis) -> int:
    """The layer with the most high-norm patches, from the norms alone (the attention they draw is not read);
    the last layer for an analysis made without token norms."""
    return analysis.map_shape[0] - 1 if analysis.token_norms is None else norms.peak_layer(analysis)


def dataset_statistics(folder: str | Path) -> DatasetStatistics:
    """What ``vit-explorer stats`` wrote into ``folder``, read once per change of its files (``methods.dataset``)."""
    return dataset.read_statistics_cached(folder)


def decompose(evidence: ClassEvidence) -> Decomposition:
    """The evidence's target's score split over the model's parts (``core.decomposition``), read off the same pass as
    the evidence: it costs no pass of its own. Raises, with the reason, for a model that cannot be decomposed."""
    if evidence.not_decomposable is not None:
        raise VitExplorerError(evidence.not_decomposable)
    if evidence.decomposition is None:
        raise VitExplorerError("this target's evidence was made without its decomposition: ask for it "
                               "(Request(decompose=True), class_evidence(..., decompose=True))")
    return evidence.decomposition


def evaluate(spec: str, source: str | Path, methods: tuple[str, ...], *, protocol: Protocol = BLUR, steps: int = 10,
             random_orders: int = 1, limit: int | None = None, masks: str | Path | None = None, fit: str = "stretch",
             input_hw: tuple[int, int] | None = None, device: str | None = None, progress: Progress = silent) -> dict | None:
    """Every map method of ``methods`` scored over the images of ``source`` (``evaluation.score_images``: deletion and
    insertion against random orders, Chefer et al.'s perturbation accuracy, and with masks the pointing game and energy),
    by the model ``spec``, in as many processes as torchrun started: each scores a contiguous share of the listing and
    the first gathers them in listing order. The report ``files.write_evaluation`` writes, on the first process; None on
    the others. ``masks``: a folder mirroring ``source`` (default: a masks/ folder beside it)."""
    unknown = [method for method in methods if method not in maps.CLASS_METHODS]
    if unknown:
        raise VitExplorerError(f"unknown method {', '.join(unknown)}; use some of {', '.join(maps.CLASS_METHODS)}")
    with dataset.process_group(device) as (device, rank, world):
        said = progress if rank == 0 else silent
        images = dataset.list_images(source)
        images = images.sliced(0, limit or None)
        model = load_model(spec, input_hw=input_hw, device=device)
        root = Path(source) if Path(source).is_dir() else None
        masks = Path(masks) if masks else (root.parent / "masks" if root is not None and (root.parent / "masks").is_dir()
                                           else None)
        said(f"scoring {', '.join(methods)} on {len(images.paths)} images from {source} through {model.name}"
             + (f" in {world} processes" if world > 1 else "")
             + (f", with masks from {masks}" if masks else ", no masks (no pointing game or energy)"), 0, "")
        share = dataset.contiguous_share(len(images.paths))
        mine = images.sliced(share.start, share.stop)
        skipped: list[dict[str, str]] = []
        views = dataset.labelled_views(mine, model, skipped, root=root, masks=masks, fit=fit)
        step = said("evaluate", len(mine.paths), "img")
        part = evaluation.score_images(model, views, methods, steps=steps, random_orders=random_orders, protocol=protocol,
                                       seed=share.start, step=step)
        # one process's per-image lists, in listing order, whatever the number of processes
        gathered = dataset.gather_in_rank_order([(part, skipped)])
    if rank != 0:
        return None
    scores = {key: [value for each, _ in gathered for value in each[key]] for key in part}
    correct = torch.tensor(scores["correct"], dtype=torch.float64)
    return {"model": model.name, "weights": "random" if model.random_weights else "trained", "source": str(source),
            "images": len(scores["correct"]), "processes": world,
            "skipped": [entry for _, each in gathered for entry in each],
            "accuracy": None if correct.isnan().all() else float(correct.nanmean()),
            "steps": steps, "random_orders": random_orders, "baseline": protocol.name,
            "curves": dict(zip(("deletion", "insertion"), protocol.curve_names, strict=True)),
            "scores": list(evaluation.SCORES), "table": evaluation.score_table(scores, methods), "per_image": scores}


def atlas(spec: str | LoadedModel, source: str | Path, *, prompts: Sequence[str] | None = None,
          bank: Sequence[str] | None = None, texts_per_head: int = atlas_method.TEXTS_PER_HEAD,
          late_layers: int | None = None, batch_size: int = 16, limit: int | None = None, fit: str = "stretch",
          shard_folder: Path | None = None, shard_size: int = dataset.SHARD_SIZE, resume: bool = False,
          input_hw: tuple[int, int] | None = None, device: str | None = None, loads_as: str | None = None,
          progress: Progress = silent) -> Atlas | None:
    """The head atlas of the model ``spec`` (or a loaded model, which ``loads_as`` loads again) over the images of
    ``source`` (``methods.atlas``):
    every head's statistics, its direct share of each image's answer, and for a model with a text tower its TextSpan
    descriptions over ``bank`` (default: the project's, ``text_bank.default_bank``) with the completeness check. Under
    torchrun the images are shared out and the first process gathers them (it returns the atlas; the others None);
    ``shard_folder`` keeps each finished shard, which ``resume`` loads instead of computing it again."""
    with dataset.process_group(device) as (device, rank, world):
        said = progress if rank == 0 else silent
        images = dataset.list_images(source)
        images = images.sliced(0, limit or None)
        model = spec if isinstance(spec, LoadedModel) else load_model(spec, input_hw=input_hw, device=device)
        parts = "each head's output vector in the joint space" if model.text is not None else "each head's share of the answer"
        step = said(f"atlas of {model.name} over {len(images.paths)} images from {source}"
                    + (f" in {world} processes" if world > 1 else "") + f": the attention statistics and {parts}, one "
                    f"forward and {model.map_shape[0]} short backward passes per batch",
                    math.ceil(len(images.paths) / batch_size / world), "batch")
        found = atlas_method.collect(model, images, prompts=prompts, batch_size=batch_size, fit=fit, shard_folder=shard_folder,
                                     shard_size=shard_size, resume=resume, step=step)
    if rank != 0:
        return None
    found.spec = spec if isinstance(spec, str) else loads_as
    if model.text is not None:
        texts = list(bank) if bank is not None else text_bank.default_bank(model.labels)
        step = progress(f"TextSpan: {texts_per_head} descriptions for each of {model.map_shape[0] * model.map_shape[1]} "
                        f"heads from a bank of {len(texts)}, and the completeness check", model.map_shape[0], "layer")
        atlas_method.describe(found, texts, model.text.embed(texts), texts_per_head=texts_per_head, late_layers=late_layers,
                              step=step)
    return found


def registers(spec: str | LoadedModel, source: str | Path, *, top_k: int | None = None, highest_layer: int | None = None,
              detect_layer: int | None = None, batch_size: int = 8, fit: str = "stretch",
              input_hw: tuple[int, int] | None = None, device: str | None = None, progress: Progress = silent) -> RegisterNeurons:
    """The register neurons of the model ``spec`` (or a loaded model) over the images of ``source``
    (``methods.registers.calibrate``; settings left None take the authors' for the model's family)."""
    images = dataset.list_images(source)
    model = spec if isinstance(spec, LoadedModel) else load_model(spec, input_hw=input_hw, device=device)
    step = progress(f"register neurons of {model.name} over {len(images.paths)} images from {source}: one forward pass per "
                    "image, reading every MLP neuron", len(images.paths), "image")
    return register_method.calibrate(model, images.paths, top_k=top_k, highest_layer=highest_layer,
                                     detect_layer=detect_layer, batch_size=batch_size, fit=fit, step=step)


def registered(model: LoadedModel, neurons: RegisterNeurons | str | Path) -> LoadedModel:
    """``model`` with a test-time register (``methods.registers``), from calibrated neurons or their file; ``model``
    itself where they change nothing."""
    chosen = neurons if isinstance(neurons, RegisterNeurons) else RegisterNeurons.read(neurons)
    return register_method.with_test_time_register(model, chosen)


def with_register(registered_model: LoadedModel, analysis: Analysis) -> Analysis:
    """The image of ``analysis`` as ``registered_model`` (a model with a test-time register, ``registered``) sees it: one
    more analysis, memoised on ``analysis``; the class evidence waits for ``evidence``, as a scoreboard asks."""
    return memo(analysis, ("with a test-time register", registered_model.name),
                lambda: analyze(registered_model, Image.fromarray(analysis.image), explain=False))


def check_full_maps(model: LoadedModel, memory_budget: int) -> None:
    """Refuse, before any pass, to keep every head's full map where the budget keeps only the compact form."""
    full_bytes = map_bytes(model.layout, *model.map_shape)
    if choose_storage(full_bytes, memory_budget) == "compact":
        raise VitExplorerError(f"every head's full map (--full-maps) takes {full_bytes / 2**20:.0f} MiB in float32, above twice "
                               f"the memory budget of {memory_budget / 2**20:g} MiB, so only the compact form is kept; raise "
                               "the budget (--memory-budget-mb) or leave out the full maps")


def answer(request: Request, analysis: Analysis, evidence: ClassEvidence | None, *,
           curves: FaithfulnessCurves | None = None, scoreboard: Scoreboard | None = None,
           sanity: SanityCurves | None = None, ablation: HeadAblation | None = None) -> Run:
    """What was computed for ``request`` as a ``Run``: the results given, the maps asked for read off the evidence, and
    the norms, the decomposition and the overview where asked (none of them a pass of its own)."""
    return Run(request=request, analysis=analysis, evidence=evidence,
               maps=maps.class_maps(analysis, request.maps, evidence, request.options), curves=curves, scoreboard=scoreboard,
               sanity=sanity, ablation=ablation, ablation_importance=None if ablation is None else evidence.importance,
               norms=token_norms(analysis) if request.norms else None,
               decomposition=decompose(evidence) if request.decompose and evidence is not None else None,
               overview=maps.overview(analysis, request.options) if request.overview else None)


def run(model: LoadedModel, image: ImageSource, request: Request = Request(), *, name: str | None = None,
        progress: Progress = silent) -> Run:
    """Answer ``request`` about ``image`` with ``model``: one analysis (one forward and backward pass), a backbone's
    similarity target where anything asked needs a target, the target's evidence with every map asked for, and each
    result asked for. A target the model cannot have is refused before any pass."""
    request.target.check(model)
    if request.full_maps:
        check_full_maps(model, request.memory_budget)
    progress(f"analysing {name or 'the image'}", 0, "")
    target = request.target.value
    if request.target.prompts is not None:  # the prompts are the classes: explained like a classifier's
        model, target = prompt_model(model, request.target.prompts), request.target.prompts.chosen
    # the upload's pass decomposes the top class only: another target's pass decomposes that one
    analysis = analyse(model, image, name=name, memory_budget=request.memory_budget, fit=request.fit,
                       decompose=request.decompose and target is None)
    if not analysis.num_classes and request.explains:
        model, analysis, target = retarget(model, analysis, request.target, request.memory_budget, request.fit, request.decompose)
        progress(f"target: {analysis.label(0)} (a backbone has no classes)", 0, "")
    options = request.options
    wanted = request.maps if request.every_map or request.method in maps.CLASS_SPECIFIC else ()
    found = (evidence(model, analysis, target, wanted, decompose=request.decompose)
             if request.explains or request.score or request.every_map else None)
    curves = (score(model, analysis, found, request.method, request.protocol, options=options, steps=request.steps,
                    random_orders=request.random_orders, progress=progress) if request.score and found is not None else None)
    sanity = check(model, analysis, found, options=options, progress=progress) if request.sanity else None
    ablation = (ablate(model, analysis, found, request.ablation, progress=progress)
                if request.ablation is not None and found is not None else None)
    board = rank(model, analysis, found, request.protocol, options=options, progress=progress) if request.scoreboard else None
    return answer(request, analysis, found, curves=curves, scoreboard=board, sanity=sanity, ablation=ablation)
