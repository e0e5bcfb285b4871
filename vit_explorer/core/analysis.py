"""``analyze``: one image through one model, captured once, kept as CPU tensors for every view.

One upload costs one forward and one backward pass: the maps of every layer, the gradient evidence of the top class
for the class-specific maps, and (asked for) its score's decomposition over the model's parts come from the same pass
(``capture``, with ``decomposition.reading`` reading the graph before the backward pass frees it). Maps are
kept in float32 while they fit the memory budget, in float16 while half of that fits, and beyond
that compactly (``map_store.compact_layer``, as each layer arrives). The ``Analysis`` holds CPU torch tensors (and the image as a
numpy picture), never the model: ``maps``, ``rollout``, ``relevance`` and the methods compute in torch, and
pictures, charts and files (``draw``) convert to numpy once, where they are made. What needs the model again (another target
class, the maps that take passes of their own: AttnLRP and LeGrad, a compact analysis's patch query) is an explicit call that
takes it (``class_evidence``, ``recompute_query_rows``); nothing kept here can run the model.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch

from vit_explorer.core import attnlrp, decomposition, legrad, relevance, stage_maps
from vit_explorer.core.capture import TOP, Captured, InputsSink, ReducingSink, RowSink, StackingSink, capture
from vit_explorer.core.decomposition import Decomposition
from vit_explorer.core.images import ImageSource, fit_note, load_image, model_view, to_pixels
from vit_explorer.core.map_store import MapStore, QueriesKeys, compact_layer, map_store, stack_compact
from vit_explorer.core.stage_rollout import WindowedAttention
from vit_explorer.core.targets import PromptAdapter, SimilarityAdapter
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import LoadedModel
from vit_explorer.models.layout import TokenLayout
from vit_explorer.models.ood import OodVerdict

DEFAULT_MEMORY_BUDGET = 1 << 30  # bytes of maps kept per analysis
T = TypeVar("T")


@dataclass(frozen=True)
class Prediction:
    index: int
    label: str
    prob: float


@dataclass
class Analysis:
    """Everything the views need for one (image, model) pair.

    Every array but the image is a CPU torch tensor.

    Attributes:
        image: the image as the model saw it ``[H, W, 3]`` uint8 (a numpy picture).
        attentions: softmax attention of every layer and head ``[layers, heads, n, n]`` (float32, or
            float16 above the memory budget), where the maps were kept whole; else None (``store.full_maps`` gives them).
        logits: ``[classes]`` float32 (empty for a backbone without a classifier).
        layout: token layout (prefix tokens, patch grid).
        labels: class names, or None when the model has none.
        model_name: the spec the model was loaded from.
        random_weights: the model was built with random weights (``@random``): a real layout, nothing learned.
        view_note: how the uploaded image became the model's input (size, stretched or padded).
        model_notes: what loading the model had to say (a backbone loaded without its head, a resampled position
            embedding), for every view of this analysis to show.
        prompt_notes: what the text tower read of each prompt, for a model prompted as a classifier.
        ood: the out-of-distribution verdict, for a model calibrated for one (``ood`` module); else None.
        queries_keys: each layer's queries and keys (``map_store.QueriesKeys``), where the maps are derived from them (every
            family that records them: ``CaptureAdapter.reads_attention_inputs``); else None.
        compact: for a compact analysis, ``head_mean`` ``[layers, n, n]``, ``prefix_rows``
            ``[layers, heads, prefix, n]``, ``patch_mean_rows`` ``[layers, heads, n]`` (float16) and the
            statistics ``[layers, heads]`` by name; else None. A patch query's rows are then
            recomputed with the model by ``recompute_query_rows``.
        token_norms: the L2 norm of every token of the residual stream after each layer ``[layers, n]``
            float32, from the same pass (the ``norms`` module reads it); None when not captured.
        output_tokens: every token as the model outputs it (after its final norm) ``[n, dim]`` float32, from the same
            pass (``maps.token_similarity``, ``maps.token_components``); None when not captured.
        layer_tokens: every token after each layer through the final norm ``[layers, n, dim]`` float16, from the same
            pass (the same views at an earlier layer); None when not captured.
        similarity: the one "class" is a backbone's similarity score (``targets``), not a class: its logit is the score
            and its softmax means nothing.
        prompted: the classes are text prompts (``targets.prompt_model``): each logit is the model's image–text logit,
            and the softmax over them is a zero-shot prediction among the prompts given.
        reads_text: the model has a text tower, so prompts can be its targets.
    """

    image: np.ndarray
    attentions: torch.Tensor | None
    logits: torch.Tensor
    layout: TokenLayout
    labels: list[str] | None
    model_name: str
    compact: dict[str, Any] | None = None
    queries_keys: QueriesKeys | None = None
    ood: OodVerdict | None = None
    view_note: str = ""
    model_notes: tuple[str, ...] = ()
    prompt_notes: tuple[str, ...] = ()
    random_weights: bool = False
    token_norms: torch.Tensor | None = None
    output_tokens: torch.Tensor | None = None
    layer_tokens: torch.Tensor | None = None
    similarity: bool = False
    prompted: bool = False
    reads_text: bool = False
    # a stage of a windowed ViT: every block's window maps, from which its class maps chain every stage (``stage_maps``)
    stage_windows: WindowedAttention | None = field(default=None, repr=False, compare=False)
    # tensors that views derive and reuse (rollout factors, query rows, statistics), bounded
    derived: OrderedDict[tuple, Any] = field(default_factory=OrderedDict, repr=False, compare=False)
    derived_limit: ClassVar[int] = 32
    # class evidence by target class: each holds a [layers, n, n] stack, so fewer are kept
    evidence: OrderedDict[int, ClassEvidence] = field(default_factory=OrderedDict, repr=False, compare=False)
    evidence_limit: ClassVar[int] = 4
    # the maps, full or compact, behind one interface (``map_store``): what every view reads them through
    store: MapStore = field(init=False, repr=False, compare=False)
    map_shape: tuple[int, int] = field(init=False)  # (layers, heads)

    def __post_init__(self) -> None:
        # a stage of a windowed ViT keeps its windows only: its store reads its own blocks' of them
        windows = stage_maps.stage_form(self.stage_windows, self.layout.grid_hw) if self.stage_windows is not None else None
        self.store = map_store(self.layout, self.attentions, self.compact, self.queries_keys, windows)
        self.map_shape = self.store.shape

    def __repr__(self) -> str:
        # one line of what it is: the default would print every tensor it holds
        layers, heads = self.map_shape
        rows, cols = self.grid
        return (f"Analysis(model={self.model_name!r}, {layers} layers × {heads} heads, grid {rows}×{cols}, "
                f"{self.num_prefix_tokens} prefix tokens, {self.num_classes} outputs, maps {self.storage})")

    @property
    def grid(self) -> tuple[int, int]:
        return self.layout.grid_hw

    @property
    def num_prefix_tokens(self) -> int:
        return self.layout.num_prefix_tokens

    @property
    def storage(self) -> str:
        return self.store.storage

    @property
    def probs(self) -> torch.Tensor:
        """Class probabilities ``[classes]``; empty for a backbone without a classifier head."""
        return self.logits.softmax(dim=-1)

    @property
    def num_classes(self) -> int:
        return self.logits.numel()

    def label(self, index: int) -> str:
        return self.labels[index] if self.labels is not None else f"class {index}"

    def class_index(self, target: int | str | None) -> int:
        """A class given by index or by name (case-insensitive); None is the top prediction."""
        if self.num_classes == 0:
            raise VitExplorerError(f"{self.model_name} has no classifier head, so it has no classes to explain")
        if target is None:
            return int(self.logits.argmax())
        if isinstance(target, str) and not target.strip().lstrip("-").isdigit():
            names = [self.label(index).lower() for index in range(self.num_classes)]
            if target.strip().lower() in names:
                return names.index(target.strip().lower())
            import difflib

            close = difflib.get_close_matches(target.lower(), names, n=3)
            hint = f"; did you mean {', '.join(repr(name) for name in close)}?" if close else ""
            raise VitExplorerError(f"{self.model_name} has no class named {target!r}{hint}")
        index = int(target)
        if not 0 <= index < self.num_classes:
            raise VitExplorerError(f"class index {index} is outside 0…{self.num_classes - 1}")
        return index

    def top_k(self, k: int = 5) -> list[Prediction]:
        probs = self.probs
        order = probs.argsort(descending=True, stable=True)[:k].tolist()
        return [Prediction(i, self.label(i), float(probs[i])) for i in order]

    @property
    def nbytes(self) -> int:
        """Bytes of arrays this analysis holds (image, maps, logits), derived caches excluded."""
        arrays = [self.image, self.logits] + [array for array in (self.token_norms, self.output_tokens, self.layer_tokens)
                                              if array is not None]
        # a stage of a windowed ViT: its store reads a part of every block's windows, which it holds
        maps = self.store.nbytes if self.stage_windows is None else self.stage_windows.nbytes
        return sum(array.nbytes for array in arrays) + maps


def memo(analysis: Analysis, key: tuple, compute: Callable[[], T]) -> T:
    """``compute()`` once per (analysis, key); the oldest entries go beyond ``analysis.derived``'s bound."""
    return bounded(analysis.derived, analysis.derived_limit, key, compute)


def bounded(cache: OrderedDict, limit: int, key: Any, compute: Callable[[], T]) -> T:
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = compute()
    cache[key] = value
    while len(cache) > limit:
        cache.popitem(last=False)
    return value


# the class-specific maps that take passes of the model of their own, by method: (model, pixels [1, 3, H, W], class) →
# [grid_h, grid_w]; the others come from the analysis's own pass
MODEL_MAPS: dict[str, Callable[[LoadedModel, torch.Tensor, int], torch.Tensor]] = {
    "legrad": legrad.legrad,
    "attnlrp": attnlrp.attnlrp,
}


# the words a caption needs on how a ``MODEL_MAPS`` method was run for a model's target, where it varies with the target
MODEL_MAP_VARIANTS: dict[str, Callable[[LoadedModel], str]] = {"legrad": legrad.variant}


def method_maps(model: LoadedModel, pixels: torch.Tensor, target: int, methods: Iterable[str]) -> dict[str, torch.Tensor]:
    """The ``MODEL_MAPS`` maps among ``methods`` for class ``target`` of one image ``pixels`` ``[1, 3, H, W]``, each
    ``[grid_h, grid_w]`` (the others need no pass of their own and are left out); for a stage of a windowed ViT, chained
    across every stage (``stage_maps``)."""
    wanted = [method for method in dict.fromkeys(methods) if method in MODEL_MAPS]
    if model.windowed:
        return {method: stage_maps.stage_model_map(model, method, pixels, target) for method in wanted}
    return {method: MODEL_MAPS[method](model, pixels, target) for method in wanted}


def method_variant(model: LoadedModel, method: str) -> str | None:
    """How a ``MODEL_MAPS`` method runs for ``model``'s target, in words, where that varies (``MODEL_MAP_VARIANTS``)."""
    if method == "legrad" and model.windowed:
        return stage_maps.legrad_variant(model)
    return MODEL_MAP_VARIANTS[method](model) if method in MODEL_MAP_VARIANTS else None


@dataclass(frozen=True)
class ClassEvidence:
    """What the class-specific views need for one target class of one analysis.

    Attributes:
        target: the class index.
        weighted: Ē = mean over heads of (∇A ⊙ A)⁺ ``[layers, n, n]`` float32, shared by
            gradient-weighted rollout and relevance (``relevance`` module); None for a stage of a windowed ViT, whose
            chains read ``stage_windows``.
        importance: Σ |∇A ⊙ A| per head ``[layers, heads]``.
        method_maps: the ``MODEL_MAPS`` maps of the target ``[grid_h, grid_w]`` by method, each added when first asked
            for (``class_evidence``'s ``methods``): tensors, so that drawing them never runs the model.
        variants: for those of them whose way of running depends on the target (``MODEL_MAP_VARIANTS``), its words.
        decomposition: the target's score split over the model's parts (``decomposition``), read off the same pass; None
            where it was not read, or where the model cannot be decomposed.
        not_decomposable: why this model's score cannot be decomposed, where the pass found that; else None.
    """

    target: int
    weighted: torch.Tensor | None
    importance: torch.Tensor
    method_maps: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)
    variants: dict[str, str] = field(default_factory=dict, repr=False, compare=False)
    decomposition: Decomposition | None = field(default=None, repr=False, compare=False)
    not_decomposable: str | None = None
    # a stage of a windowed ViT: every block's window maps with the target's gradients (``stage_maps``)
    stage_windows: WindowedAttention | None = field(default=None, repr=False, compare=False)

    @property
    def decomposition_read(self) -> bool:
        """Whether the pass read the decomposition (or found why there is none): no pass is needed again for it."""
        return self.decomposition is not None or self.not_decomposable is not None

    @classmethod
    def from_layers(cls, target: int, layers: list[tuple[torch.Tensor, torch.Tensor]], image: int = 0,
                    method_maps: dict[str, torch.Tensor] | None = None) -> ClassEvidence:
        """Image ``image``'s evidence from ``capture``'s per-layer ``relevance.layer_evidence`` pairs."""
        return cls(target=target, weighted=torch.stack([weighted[image] for weighted, _ in layers]),
                   importance=torch.stack([importance[image] for _, importance in layers]), method_maps=dict(method_maps or {}))

    @classmethod
    def from_capture(cls, captured: Captured, labels: Callable[[int], str]) -> ClassEvidence:
        """Image 0's evidence from a ``capture`` with ``relevance.layer_evidence`` and the decomposition's graph reader,
        its decomposition named by ``labels``."""
        target = int(captured.targets[0])
        evidence = cls.from_layers(target, captured.gradients)
        if isinstance(captured.reading, VitExplorerError):
            return replace(evidence, not_decomposable=str(captured.reading))
        if isinstance(captured.reading, Decomposition):
            return replace(evidence, decomposition=replace(captured.reading, label=labels(target)))
        return evidence


def class_evidence(model: LoadedModel, analysis: Analysis, target: int | str | None = None, methods: Iterable[str] = (),
                   decompose: bool = False) -> ClassEvidence:
    """The gradient evidence of ``target`` (default: top class), with the maps of those ``methods`` that take passes of
    the model of their own (``MODEL_MAPS``: AttnLRP, LeGrad) computed and kept on it, and with ``decompose`` the
    target's decomposition read off the same pass. The top class's gradient evidence comes with the analysis; another
    target's costs one forward and one backward pass of ``analysis``'s image, and the last few are kept on the analysis
    so that switching back costs nothing; each method's map is computed once."""
    check_model(model, analysis)
    index = analysis.class_index(target)

    def compute() -> ClassEvidence:
        pixels = pixels_of(model, analysis)
        if model.windowed:
            return windowed_evidence(model, stage_maps.windows_of(model, pixels, index))
        captured = capture(model, pixels, target=index, reduce_gradients=relevance.layer_evidence,
                           graph_reader=decomposition.reading if decompose else None)
        return ClassEvidence.from_capture(captured, analysis.label)

    kept = analysis.evidence.get(index)
    if decompose and kept is not None and not kept.decomposition_read:  # kept without it: the pass again, for it
        again = compute()
        analysis.evidence[index] = replace(kept, decomposition=again.decomposition, not_decomposable=again.not_decomposable)
    evidence = bounded(analysis.evidence, analysis.evidence_limit, index, compute)
    missing = [method for method in methods if method in MODEL_MAPS and method not in evidence.method_maps]
    if missing:
        evidence.method_maps.update(method_maps(model, pixels_of(model, analysis), index, missing))
        evidence.variants.update({method: variant for method in missing
                                  if (variant := method_variant(model, method)) is not None})
    return evidence


def windowed_evidence(model: LoadedModel, windows: WindowedAttention) -> ClassEvidence:
    """The evidence of a stage of a windowed ViT from every block's windows and their gradients for ``windows.target``
    (``stage_maps``); its decomposition is refused with the family's reason."""
    try:
        model.adapter.attention_writes(model.module)
        refused = None
    except VitExplorerError as error:
        refused = str(error)
    importance = stage_maps.head_importance(windows, model.layout.grid_hw)
    return ClassEvidence(target=windows.target, weighted=None, importance=importance, stage_windows=windows,
                         not_decomposable=refused)


def check_model(model: LoadedModel, analysis: Analysis) -> None:
    if model.name != analysis.model_name:
        raise VitExplorerError(f"this analysis was made with {analysis.model_name}, not {model.name}")


def pixels_of(model: LoadedModel, analysis: Analysis) -> torch.Tensor:
    """The model's input for the image of ``analysis`` ``[1, 3, H, W]``, on the model's device."""
    return to_pixels(analysis.image, model.preprocess).to(model.device)


def map_bytes(layout: TokenLayout, layers: int, heads: int, itemsize: int = 4) -> int:
    """Bytes of the full ``[layers, heads, n, n]`` stack."""
    return layers * heads * layout.num_tokens**2 * itemsize


def input_bytes(layout: TokenLayout, model: LoadedModel, itemsize: int = 4) -> int:
    """Bytes of every layer's queries and keys ``2 × [layers, heads, n, head_dim]``."""
    layers, _ = model.map_shape
    return 2 * layers * layout.num_tokens * model.adapter.attention_width(model.module) * itemsize


def choose_storage(full_bytes: int, memory_budget: int) -> str:
    """"float32" if the float32 form fits the budget, "float16" if half of it does, else "compact"."""
    if full_bytes <= memory_budget:
        return "float32"
    return "float16" if full_bytes // 2 <= memory_budget else "compact"


def map_sink(model: LoadedModel, memory_budget: int, gradients: bool) -> InputsSink | ReducingSink | StackingSink:
    """Where ``analyze``'s pass keeps the maps (module doc). A pass with ``gradients`` runs the explicit path, which makes
    every map anyway: they are kept whole where they fit the budget. Otherwise each layer's queries and keys are kept where
    the family records them (float16 above the budget), from its fused forward; a family that does not keeps its maps
    float32, float16 or compactly by the budget."""
    map_storage = choose_storage(map_bytes(model.layout, *model.map_shape), memory_budget)
    if model.adapter.reads_attention_inputs and not (gradients and map_storage == "float32"):
        return InputsSink(model.map_shape[0], torch.float16 if choose_storage(input_bytes(model.layout, model),
                                                                             memory_budget) != "float32" else torch.float32)
    if map_storage == "compact":
        return ReducingSink(partial(compact_layer, layout=model.layout), stack_compact)
    return StackingSink(model.map_shape[0], dtype=torch.float16 if map_storage == "float16" else torch.float32)


def analyze(model: LoadedModel, image: ImageSource, name: str | None = None, memory_budget: int = DEFAULT_MEMORY_BUDGET,
            fit: str = "stretch", explain: bool = True, decompose: bool = False) -> Analysis:
    """Decode ``image``, fit it to the model's input (``images.FITS``), and capture every layer's attention
    in one forward pass; with ``explain`` (and a classifier head), one backward pass gives the top class's evidence for
    the class-specific maps, and with ``decompose`` its decomposition too.

    Where the maps come from (``map_sink``): with a class to explain and every map within ``memory_budget`` (bytes), the
    pass with the gradients keeps them whole. Otherwise a family that records its attention inputs runs its own fused
    forward, keeping each layer's queries and keys (the maps are derived from them when asked: memory linear in the
    tokens), and the gradients, where wanted, take a pass of their own; another family keeps float16 or compact maps.
    """
    decoded = load_image(image, name)
    view = model_view(decoded, model.preprocess, fit)
    pixels = to_pixels(view, model.preprocess).to(model.device)
    # a backbone has no class to differentiate: no graph is built for it (one forward under inference mode)
    target = TOP if explain and model.num_classes else None
    facts = {"image": view, "layout": model.layout, "labels": model.labels, "model_name": model.name,
             "view_note": fit_note(decoded.size, model.preprocess.input_hw, fit), "model_notes": tuple(model.notes),
             "prompt_notes": tuple(model.prompt_notes), "random_weights": model.random_weights,
             "similarity": isinstance(model.adapter, SimilarityAdapter), "prompted": isinstance(model.adapter, PromptAdapter),
             "reads_text": model.text is not None}
    if model.windowed:
        return windowed_analysis(model, pixels, target, facts)
    sink = map_sink(model, memory_budget, gradients=target is not None)
    separate = isinstance(sink, InputsSink)
    captured = capture(model, pixels, sink, target=None if separate else target, reduce_gradients=relevance.layer_evidence,
                       norms=True, graph_reader=decomposition.reading if decompose and not separate else None)
    kept = captured.kept
    result = Analysis(attentions=kept[0].cpu() if isinstance(sink, StackingSink) else None,  # one transfer
                      compact=kept if isinstance(sink, ReducingSink) else None, queries_keys=kept[0] if separate else None,
                      logits=captured.logits[0].float().cpu(),
                      ood=model.ood.verdict(captured.logits[0]) if model.ood is not None else None,
                      token_norms=captured.token_norms[0], output_tokens=captured.output_tokens[0],
                      layer_tokens=captured.layer_tokens[0], **facts)
    if separate and target is not None:
        class_evidence(model, result, decompose=decompose)
    elif captured.targets is not None:
        evidence = ClassEvidence.from_capture(captured, result.label)
        result.evidence[evidence.target] = evidence
    return result


def windowed_analysis(model: LoadedModel, pixels: torch.Tensor, target: str | None, facts: dict) -> Analysis:
    """A stage of a windowed ViT analysed from one pass that keeps every block's window maps (with ``target``, and the
    top class's gradients) and the stage's token norms: no grid's n × n map is made (``stage_maps``)."""
    windows, (token_norms, output_tokens, layer_tokens) = stage_maps.windows_and_norms(model, pixels, target)
    result = Analysis(attentions=None, logits=windows.logits.cpu(), stage_windows=windows, token_norms=token_norms[0],
                      output_tokens=output_tokens[0], layer_tokens=layer_tokens[0],
                      ood=model.ood.verdict(windows.logits) if model.ood is not None else None, **facts)
    if windows.target is not None:
        result.evidence[windows.target] = windowed_evidence(model, windows)
    return result


def recompute_query_rows(model: LoadedModel, analysis: Analysis, query: int) -> torch.Tensor:
    """Every head's row of token ``query`` in every layer ``[layers, heads, n]``, recomputed with one
    forward pass of ``model`` (none where the store keeps it) and handed to the analysis's map store, which
    answers it from then on. For a compact analysis, which did not keep patch queries' rows."""
    check_model(model, analysis)
    if not analysis.store.keeps_rows_of(query):
        analysis.store.add_patch_rows(query, capture(model, pixels_of(model, analysis), RowSink(query)).kept)
    return analysis.store.query_rows(query)


def queries_and_keys(model: LoadedModel, analysis: Analysis) -> QueriesKeys:
    """Every layer's queries and keys of the analysed image: those the analysis keeps, else recorded by one fused forward
    pass of ``model`` and memoised on the analysis (one that kept its maps whole, e.g. a classifier's within the budget)."""
    if analysis.queries_keys is not None:
        return analysis.queries_keys
    check_model(model, analysis)
    # a family whose queries and keys are not read refuses in ``recorded_inputs``, saying why
    return memo(analysis, ("queries and keys",), lambda: capture(model, pixels_of(model, analysis),
                                                                  InputsSink(model.map_shape[0])).kept[0])
