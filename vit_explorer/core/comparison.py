"""Two analyses side by side (the app's Compare tab): the second side (B), made once from a second image, a
second model or both, and how it lines up with the main analysis (A): layers by relative depth, the query and the
target class each side shows, and the signed difference A − B of two maps (tensors, as ``maps`` gives them).
Bookkeeping and tensor arithmetic only; nothing here runs a model or draws."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace

import torch

from vit_explorer.core import maps
from vit_explorer.core.analysis import Analysis, ClassEvidence
from vit_explorer.core.interventions import Patching
from vit_explorer.errors import VitExplorerError


@dataclass(frozen=True)
class Match:
    """Why two images match, for a backbone: A's analysis and evidence for the similarity of its embedding to B's
    direction, and B's for its similarity to A's (``core.targets``: *another image*), each side's one "class" 0, every
    map that takes passes of its own already in the evidence; made beside the main analysis ``paired``."""

    a: Analysis = field(repr=False)
    a_evidence: ClassEvidence = field(repr=False)
    b: Analysis = field(repr=False)
    b_evidence: ClassEvidence = field(repr=False)
    paired: weakref.ReferenceType = field(repr=False)


@dataclass(eq=False)  # compared by identity: a new comparison is a new key for the views drawn from it
class Comparison:
    """The second side of a comparison: its analysis, made by one upload pass, and what it was made from.

    Attributes:
        analysis: B's analysis.
        source: the image file B analysed (the main upload where B shows the main image).
        spec: B's model spec (the main model's where B uses the main model).
        fit: the fit of B's image to its model's input (``images.FITS``).
        image_name: the second image's file name; None where B shows the main image.
        second_model: B's model was chosen for the comparison, rather than the main model.
        paired: the main analysis B was made beside (a weak reference: the main session owns it).
        evidence: B's class evidence for its target when B was made (``target_b``), as ``class_evidence``
            returned it; None for a backbone.
        match: for a backbone, why A and B match (``Match``), once asked for.
        patching: B patched into A (``methods.patching``) for the main analysis and target it was made for, once asked.
    """

    analysis: Analysis = field(repr=False)
    source: str
    spec: str
    fit: str
    image_name: str | None
    second_model: bool
    paired: weakref.ReferenceType = field(repr=False)
    evidence: ClassEvidence | None = field(default=None, repr=False)
    match: Match | None = field(default=None, repr=False)
    patching: tuple[weakref.ReferenceType, Patching] | None = field(default=None, repr=False)

    def patched(self, main: Analysis, target: int | None) -> Patching | None:
        """The patching of B into ``main`` for ``target``, where that is what was patched; else None."""
        if self.patching is None or self.patching[0]() is not main or self.patching[1].target != target:
            return None
        return self.patching[1]

    def made_from(self, source: str, spec: str, fit: str, labels: list[str] | None) -> bool:
        """Whether B is the analysis of ``source`` by ``spec`` with ``fit``, its classes ``labels`` (a text model's
        prompts change them): then a new comparison reuses it."""
        return (self.source, self.spec, self.fit, self.analysis.labels) == (source, spec, fit, labels)

    def outdated(self, main: Analysis, main_spec: str, fit: str) -> str | None:
        """What of the main side changed since B was made beside it, where B follows it: "image" (a new main
        analysis, where B shows the main image), "model" (where B uses the main model) or "fit"; else None."""
        if self.image_name is None and self.paired() is not main:
            return "image"
        if not self.second_model and self.spec != main_spec:
            return "model"
        return "fit" if self.fit != fit else None


def aligned_layer(layer: int, layers_a: int, layers_b: int) -> int:
    """B's layer at the relative depth of A's ``layer``: round(layer · (L_B − 1) / (L_A − 1)), halves rounded
    up (in integers, so that no float error tips a half), 0 where A has a single layer."""
    if not 0 <= layer < layers_a:
        raise VitExplorerError(f"layer {layer} is outside 0…{layers_a - 1}")
    if layers_a == 1:
        return 0
    return (2 * layer * (layers_b - 1) + layers_a - 1) // (2 * (layers_a - 1))


def relative_depth(layers: int) -> torch.Tensor:
    """Each layer's depth as a share of the way from the first layer to the last ``[layers]`` (0 … 1; 0 for one layer)."""
    return torch.arange(layers, dtype=torch.float64) / max(layers - 1, 1)


def counterpart_query(a: Analysis, b: Analysis, query: int | None) -> int | None:
    """B's token for A's ``query``: the mean of patch queries for the mean, the prefix token of the same name, the
    patch at the same grid position where the grids match and B kept that patch's rows; -1 where there is none."""
    if query is None:
        return None
    patch = a.layout.token_patch(query)
    if patch is None:
        name = a.layout.prefix_names[query]
        return b.layout.prefix_names.index(name) if name in b.layout.prefix_names else -1
    return b.layout.patch_token(*patch) if a.grid == b.grid and b.store.keeps_rows_of(b.layout.patch_token(*patch)) else -1


def queries(a: Analysis, b: Analysis, query: int | None) -> tuple[int | None, int | None]:
    """The query each side shows: A's ``query`` and its counterpart in B, or, where B has none, each side's
    default query (``maps.default_query``)."""
    other = counterpart_query(a, b, query)
    return (query, other) if other != -1 else (maps.default_query(a), maps.default_query(b))


def same_classes(a: Analysis, b: Analysis) -> bool:
    """Whether a class index means the same class on both sides (same number of classes, same names)."""
    return a.num_classes > 0 and a.num_classes == b.num_classes and a.labels == b.labels


def target_b(a: Analysis, b: Analysis, target_a: int | None) -> int | None:
    """B's target class: A's where the classes are the same, else B's top prediction; None for a backbone."""
    if b.num_classes == 0:
        return None
    return target_a if target_a is not None and same_classes(a, b) else int(b.logits.argmax())


@dataclass(frozen=True)
class Side:
    """What one side of a comparison shows: its analysis, query, layer and head, rollout start layer, target class
    and that class's evidence (None where it has no classifier, or B's evidence for the target is not computed)."""

    analysis: Analysis
    query: int | None
    layer: int
    head: int | None  # None: the mean of heads
    start_layer: int
    target: int | None
    evidence: ClassEvidence | None


def sides(main: Analysis, evidence: ClassEvidence | None, comparison: Comparison, query: int | None, layer: int,
          head: int | None, start_layer: int) -> tuple[Side, Side]:
    """A (the main analysis, its target's ``evidence``, the chosen query, layer, head and rollout start layer) and B
    lined up with it: the counterpart query, the layers at the same relative depth, the same head where B has it
    (else B's mean of heads), and B's target class (``target_b``). Where the comparison holds why the two match for
    this main analysis (``Match``), each side is that similarity's analysis with its evidence: the same maps, one
    target."""
    match = comparison.match
    if match is not None and match.paired() is main:
        main, evidence = match.a, match.a_evidence
        comparison = replace(comparison, analysis=match.b, evidence=match.b_evidence)
    b = comparison.analysis
    query_a, query_b = queries(main, b, query)
    layers_a, layers_b = main.map_shape[0], b.map_shape[0]
    target_a = None if evidence is None else evidence.target
    target = target_b(main, b, target_a)
    return (Side(main, query_a, layer, head, start_layer, target_a, evidence),
            Side(b, query_b, aligned_layer(layer, layers_a, layers_b), head if head is None or head < b.map_shape[1] else None,
                 aligned_layer(start_layer, layers_a, layers_b), target,
                 comparison.evidence if comparison.evidence is not None and comparison.evidence.target == target else None))


def grid_mismatch(a: Analysis, b: Analysis) -> str | None:
    """Why A's and B's maps cannot be subtracted (their patch grids differ), or None where they can."""
    if a.grid == b.grid:
        return None
    return (f"A's patch grid is {a.grid[0]}×{a.grid[1]} and B's is {b.grid[0]}×{b.grid[1]}: a difference needs both maps on the "
            "same grid")


def difference(map_a: torch.Tensor, map_b: torch.Tensor) -> torch.Tensor:
    """The signed difference A − B of two maps on the same patch grid ``[grid_h, grid_w]`` float32."""
    if map_a.shape != map_b.shape:
        raise VitExplorerError(f"maps of grids {tuple(map_a.shape)} and {tuple(map_b.shape)} cannot be subtracted")
    return map_a.float() - map_b.float()
