"""``run``: one request about one image, answered in one place.

The entry points (the CLI's ``analyze``, ``explain``, the app's buttons and export) build a ``Request`` and call these
functions; none of them writes the workflow again. ``run`` analyses the image, gives a backbone its similarity target
(``retarget``) and a CLIP-like model its prompts as classes (``targets.prompt_model``), computes the target's evidence
and every map asked for (AttnLRP and LeGrad too, as tensors), and the score, scoreboard, sanity check, ablation, norms
and decomposition that were asked for. Each long stage reports through one ``Progress`` callback, which says what it
costs before it starts. The ``Run`` it returns holds no model.
"""

from __future__ import annotations

from collections.abc import Callable

from PIL import Image

from vit_explorer.core import maps
from vit_explorer.core.analysis import (
    DEFAULT_MEMORY_BUDGET,
    Analysis,
    ClassEvidence,
    analyze,
    choose_storage,
    class_evidence,
    map_bytes,
    pixels_of,
)
from vit_explorer.core.curves import DEFAULT_RANDOM_ORDERS, DEFAULT_STEPS, FaithfulnessCurves, Protocol, SanityCurves
from vit_explorer.core.decomposition import Decomposition
from vit_explorer.core.images import ImageSource, load_image, model_view, to_pixels
from vit_explorer.core.interventions import HeadAblation
from vit_explorer.core.ranking import Scoreboard
from vit_explorer.core.request import Request, Run
from vit_explorer.core.targets import Target, prompt_model, similarity_model
from vit_explorer.errors import VitExplorerError
from vit_explorer.methods import faithfulness, norms, scoreboard
from vit_explorer.methods.ablation import ablation_of, cost_text
from vit_explorer.methods.sanity import sanity_check
from vit_explorer.models.base import LoadedModel

# a long stage about to start: (what it does and costs, in words; how many steps; what a step is) → called after each
# step; a stage of 0 steps is a line to show
Progress = Callable[[str, int, str], Callable[[], None]]


def silent(description: str, total: int, unit: str) -> Callable[[], None]:
    return lambda: None


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


def score(model: LoadedModel, analysis: Analysis, evidence: ClassEvidence, method: str, protocol: Protocol, *,
          options: maps.RolloutOptions = maps.RolloutOptions(), steps: int = DEFAULT_STEPS,
          random_orders: int = DEFAULT_RANDOM_ORDERS, progress: Progress = silent) -> FaithfulnessCurves:
    """The faithfulness curves of ``method``'s map for the evidence's target (``faithfulness.deletion_insertion``)."""
    evidence = class_evidence(model, analysis, evidence.target, (method,))
    total = faithfulness.batches(steps, random_orders, protocol=protocol)
    step = progress(f"scoring the {method} map: {protocol.description}, "
                    f"{faithfulness.forward_passes(steps, random_orders, protocol)} forward passes", total, "batch")
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
    """Each head removed in turn (``ablation.ablation_of``), kept on the analysis."""
    step = progress(f"head ablation ({mode}): each head removed in turn, {cost_text(*analysis.map_shape)}", analysis.map_shape[0],
                    "layer")
    return ablation_of(model, analysis, evidence.target, mode, step=step)


def decompose(evidence: ClassEvidence) -> Decomposition:
    """The evidence's target's score split over the model's parts (``core.decomposition``), read off the same pass as
    the evidence: it costs no pass of its own. Raises, with the reason, for a model that cannot be decomposed."""
    if evidence.not_decomposable is not None:
        raise VitExplorerError(evidence.not_decomposable)
    if evidence.decomposition is None:
        raise VitExplorerError("this target's evidence was made without its decomposition: ask for it "
                               "(Request(decompose=True), class_evidence(..., decompose=True))")
    return evidence.decomposition


def check_full_maps(model: LoadedModel, memory_budget: int) -> None:
    """Refuse, before any pass, to keep every head's full map where the budget keeps only the compact form."""
    full_bytes = map_bytes(model.layout, *model.map_shape)
    if choose_storage(full_bytes, memory_budget) == "compact":
        raise VitExplorerError(f"every head's full map (--full-maps) takes {full_bytes / 2**20:.0f} MiB in float32, above twice "
                               f"the memory budget of {memory_budget / 2**20:g} MiB, so only the compact form is kept; raise "
                               "the budget (--memory-budget-mb) or leave out the full maps")


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
    analysis = analyze(model, image, name=name, memory_budget=request.memory_budget, fit=request.fit,
                       decompose=request.decompose and target is None)
    if not analysis.num_classes and request.explains:
        model, analysis, target = retarget(model, analysis, request.target, request.memory_budget, request.fit, request.decompose)
        progress(f"target: {analysis.label(0)} (a backbone has no classes)", 0, "")
    options = request.options
    wanted = request.maps if request.every_map or request.method in maps.CLASS_SPECIFIC else ()
    evidence = (class_evidence(model, analysis, target, wanted, decompose=request.decompose)
                if analysis.num_classes and (request.explains or request.score or request.every_map) else None)
    decomposition = decompose(evidence) if request.decompose and evidence is not None else None
    shown = maps.class_maps(analysis, request.maps, evidence, options)
    curves = (score(model, analysis, evidence, request.method, request.protocol, options=options, steps=request.steps,
                    random_orders=request.random_orders, progress=progress) if request.score and evidence is not None else None)
    sanity = check(model, analysis, evidence, options=options, progress=progress) if request.sanity else None
    ablation = (ablate(model, analysis, evidence, request.ablation, progress=progress)
                if request.ablation is not None and evidence is not None else None)
    board = rank(model, analysis, evidence, request.protocol, options=options, progress=progress) if request.scoreboard else None
    return Run(request=request, analysis=analysis, evidence=evidence, maps=shown, curves=curves, scoreboard=board, sanity=sanity,
               ablation=ablation, ablation_importance=None if ablation is None else evidence.importance,
               norms=norms.for_analysis(analysis) if request.norms else None, decomposition=decomposition,
               overview=maps.overview(analysis, options) if request.overview else None)
