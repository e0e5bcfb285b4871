"""``analyze``: one image through one model, captured once, kept as CPU arrays for every view.

Maps are kept in float32 while they fit the memory budget, in float16 while half of that fits,
and beyond that compactly: per layer the head-mean matrix (for rollout), every head's rows of the
prefix tokens and of the mean patch query, and the head statistics — each reduced as its layer's
map arrives, so the full stack is never held. A patch query's per-head rows are then recomputed
on demand with one more forward pass.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch

from . import relevance, stats
from .capture import LayerSink, capture_into, record_attention_gradients
from .errors import VitExplorerError
from .images import ImageSource, fit_note, load_image, model_view, to_pixels
from .layout import TokenLayout
from .models.base import LoadedModel
from .ood import OodVerdict, recording_features

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

    Attributes:
        image: the image as the model saw it ``[H, W, 3]`` uint8.
        attentions: softmax attention of every layer and head ``[layers, heads, n, n]`` (float32, or
            float16 above the memory budget); None when the analysis is compact.
        logits: ``[classes]`` (empty for a backbone without a classifier).
        layout: token layout (prefix tokens, patch grid).
        labels: class names, or None when the model has none.
        model_name: the spec the model was loaded from.
        random_weights: the model was built with random weights (``@random``): a real layout, nothing learned.
        view_note: how the uploaded image became the model's input (size, stretched or padded).
        ood: the out-of-distribution verdict, for a model calibrated for one (``ood`` module); else None.
        compact: for a compact analysis, ``head_mean`` ``[layers, n, n]``, ``prefix_rows``
            ``[layers, heads, prefix, n]``, ``patch_mean_rows`` ``[layers, heads, n]`` and the
            statistics ``[layers, heads]`` by name; else None.
        row_source: for a compact analysis, recomputes one query's rows ``[layers, heads, n]`` with
            a forward pass (it holds the model); else None.
    """

    image: np.ndarray
    attentions: np.ndarray | None
    logits: np.ndarray
    layout: TokenLayout
    labels: list[str] | None
    model_name: str
    compact: dict[str, Any] | None = None
    ood: OodVerdict | None = None
    view_note: str = ""
    random_weights: bool = False
    row_source: Callable[[int], np.ndarray] | None = field(default=None, repr=False)
    # arrays that views derive and reuse (rollout factors, query rows, statistics), bounded
    derived: OrderedDict[tuple, Any] = field(default_factory=OrderedDict, repr=False, compare=False)
    derived_limit: ClassVar[int] = 32
    # class evidence by target class: each holds a [layers, n, n] stack, so fewer are kept
    evidence: OrderedDict[int, ClassEvidence] = field(default_factory=OrderedDict, repr=False, compare=False)
    evidence_limit: ClassVar[int] = 4

    @property
    def grid(self) -> tuple[int, int]:
        return self.layout.grid_hw

    @property
    def num_prefix_tokens(self) -> int:
        return self.layout.num_prefix_tokens

    @property
    def map_shape(self) -> tuple[int, int]:
        """(layers, heads)."""
        if self.attentions is not None:
            return self.attentions.shape[:2]
        return self.compact["patch_mean_rows"].shape[:2]

    @property
    def storage(self) -> str:
        if self.attentions is None:
            return "compact float16 (head means, prefix rows, statistics)"
        return str(self.attentions.dtype)

    @property
    def probs(self) -> np.ndarray:
        """Class probabilities ``[classes]``; empty for a backbone without a classifier head."""
        if self.logits.size == 0:
            return self.logits
        shifted = np.exp(self.logits - self.logits.max())
        return shifted / shifted.sum()

    @property
    def num_classes(self) -> int:
        return int(self.logits.size)

    def label(self, index: int) -> str:
        return self.labels[index] if self.labels is not None else f"class {index}"

    def class_index(self, target: int | str | None) -> int:
        """A class given by index or by name (case-insensitive); None is the top prediction."""
        if self.num_classes == 0:
            raise VitExplorerError(f"{self.model_name} has no classifier head, so it has no classes to explain")
        if target is None:
            return int(np.argmax(self.logits))
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
        order = np.argsort(-probs)[:k]
        return [Prediction(int(i), self.label(int(i)), float(probs[i])) for i in order]

    @property
    def nbytes(self) -> int:
        """Bytes of arrays this analysis holds (image, maps, logits), derived caches excluded."""
        arrays = [self.image, self.logits]
        if self.attentions is not None:
            arrays.append(self.attentions)
        else:
            arrays += [value for value in self.compact.values() if isinstance(value, np.ndarray)]
            arrays += list(self.compact["statistics"].values())
        return sum(array.nbytes for array in arrays)


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


@dataclass(frozen=True)
class ClassEvidence:
    """What the class-specific views need for one target class of one analysis.

    Attributes:
        target: the class index.
        weighted: Ē = mean over heads of (∇A ⊙ A)⁺ ``[layers, n, n]`` float32, shared by
            gradient-weighted rollout and relevance (``relevance`` module).
        importance: Σ |∇A ⊙ A| per head ``[layers, heads]``.
    """

    target: int
    weighted: np.ndarray
    importance: np.ndarray

    @classmethod
    def from_gradients(cls, target: int, attentions: torch.Tensor, gradients: torch.Tensor) -> ClassEvidence:
        """Reduce one image's maps and their gradients, both ``[layers, heads, n, n]``."""
        return cls(target=target, weighted=relevance.weighted_attention(attentions, gradients).numpy(),
                   importance=relevance.gradient_importance(attentions, gradients).numpy())


def class_evidence(model: LoadedModel, analysis: Analysis, target: int | str | None = None) -> ClassEvidence:
    """One forward and backward pass of ``analysis``'s image for ``target`` (default: top class), kept
    on the analysis for the last few targets so that switching back costs nothing."""
    if model.name != analysis.model_name:
        raise VitExplorerError(f"this analysis was made with {analysis.model_name}, not {model.name}")
    index = analysis.class_index(target)

    def compute() -> ClassEvidence:
        pixels = to_pixels(analysis.image, model.preprocess).to(model.device)
        _, attentions, gradients = record_attention_gradients(model, pixels, torch.tensor([index]))
        return ClassEvidence.from_gradients(index, attentions[0].float().cpu(), gradients[0].float().cpu())

    return bounded(analysis.evidence, analysis.evidence_limit, index, compute)


def map_bytes(layout: TokenLayout, layers: int, heads: int, itemsize: int = 4) -> int:
    """Bytes of the full ``[layers, heads, n, n]`` stack."""
    return layers * heads * layout.num_tokens**2 * itemsize


def choose_storage(full_bytes: int, memory_budget: int) -> str:
    """"float32" if the full float32 stack fits the budget, "float16" if half of it does, else "compact"."""
    if full_bytes <= memory_budget:
        return "float32"
    return "float16" if full_bytes // 2 <= memory_budget else "compact"


class StackSink(LayerSink):
    """Keeps each layer's map of image 0 in ``dtype`` as it arrives, where the model runs; ``stack``
    brings them to the CPU in one transfer (one copy on a CPU)."""

    def __init__(self, dtype: np.dtype) -> None:
        super().__init__()
        self.dtype = torch.from_numpy(np.zeros(0, dtype=dtype)).dtype

    def __setitem__(self, layer: int, attention: torch.Tensor) -> None:
        self.layers[layer] = attention[0].to(self.dtype)

    def stack(self) -> np.ndarray:
        return torch.stack(self.in_layer_order()).cpu().numpy()  # [layers, heads, n, n]


class CompactSink(LayerSink):
    """Reduces each layer's map to what the views need, then drops it."""

    def __init__(self, layout: TokenLayout) -> None:
        super().__init__()
        self.layout = layout

    def __setitem__(self, layer: int, attention: torch.Tensor) -> None:
        maps = attention[0].to(torch.float32).cpu().numpy()  # [heads, n, n], this layer only
        prefix = self.layout.num_prefix_tokens
        statistics = {name: compute(maps[None], self.layout)[0] for name, compute in stats.HEAD_STATISTICS.items()}
        self.layers[layer] = {
            "head_mean": maps.mean(axis=0).astype(np.float16),
            "prefix_rows": maps[:, :prefix, :].astype(np.float16),
            "patch_mean_rows": maps[:, prefix:, :].mean(axis=1).astype(np.float16),
            "statistics": statistics,
        }

    def reduced(self) -> dict[str, Any]:
        layers = self.in_layer_order()
        return {
            "head_mean": np.stack([layer["head_mean"] for layer in layers]),
            "prefix_rows": np.stack([layer["prefix_rows"] for layer in layers]),
            "patch_mean_rows": np.stack([layer["patch_mean_rows"] for layer in layers]),
            "statistics": {name: np.stack([layer["statistics"][name] for layer in layers]) for name in stats.HEAD_STATISTICS},
        }


class RowSink(StackSink):
    """Keeps only one query's row of every head ``[heads, n]`` per layer."""

    def __init__(self, query: int) -> None:
        super().__init__(np.float32)
        self.query = query

    def __setitem__(self, layer: int, attention: torch.Tensor) -> None:
        self.layers[layer] = attention[0, :, self.query, :].to(torch.float32)


def analyze(model: LoadedModel, image: ImageSource, name: str | None = None, memory_budget: int = DEFAULT_MEMORY_BUDGET,
            fit: str = "stretch") -> Analysis:
    """Decode ``image``, fit it to the model's input (``images.FITS``), capture every layer's attention once.

    ``memory_budget`` (bytes) decides how the maps are kept: float32, float16 or compact (module doc).
    """
    decoded = load_image(image, name)
    view = model_view(decoded, model.preprocess, fit)
    pixels = to_pixels(view, model.preprocess).to(model.device)
    storage = choose_storage(map_bytes(model.layout, *model.adapter.map_shape(model.module)), memory_budget)
    sink = CompactSink(model.layout) if storage == "compact" else StackSink(np.dtype(storage))
    head = model.adapter.classifier(model.module) if model.ood is not None else None
    with recording_features(head) as features:  # read from the same forward pass as the maps
        logits = capture_into(model, pixels, sink)
    result = Analysis(image=view, attentions=None, logits=logits[0].float().cpu().numpy(), layout=model.layout,
                      labels=model.labels, model_name=model.name,
                      ood=model.ood.verdict(features[0][0].numpy()) if model.ood is not None else None,
                      view_note=fit_note(decoded.size, model.preprocess.input_hw, fit), random_weights=model.random_weights)
    if isinstance(sink, CompactSink):
        result.compact = sink.reduced()
        result.row_source = lambda query: query_rows_by_forward(model, pixels, query)
        model.layout.validate(result.compact["head_mean"].shape[-1])
    else:
        result.attentions = sink.stack()
        model.layout.validate(result.attentions.shape[-1])
    return result


def query_rows_by_forward(model: LoadedModel, pixels: torch.Tensor, query: int) -> np.ndarray:
    """Every head's row of token ``query`` in every layer ``[layers, heads, n]``, from one more forward pass."""
    sink = RowSink(query)
    capture_into(model, pixels, sink)
    return sink.stack()
