"""The maps every view shows, computed from one cached ``Analysis``, never from the model.

Pure torch math over the analysis's CPU tensors (no pictures, no UI): the rows a query sends to every
layer and head, rollout and the class-specific maps over the patch grid, head statistics and rankings.
Every map comes back as a tensor; the render layer turns it into pixels. Derived tensors that several
views reuse (rollout factors, query rows, statistics) are memoised on the analysis, bounded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from vit_explorer.core.analysis import MODEL_MAPS, Analysis, ClassEvidence, memo
from vit_explorer.core.relevance import grad_rollout_factors, relevance_factors
from vit_explorer.core.rollout import block_factors, rollout_rows
from vit_explorer.core.stage_maps import chained_map
from vit_explorer.errors import VitExplorerError

GRADIENT_IMPORTANCE = "gradient importance"
# the direction each ranking lists heads in: focused, local heads first; sinks and important heads first
RANKINGS = {"entropy": "lowest first", "distance": "shortest first", "prefix share": "highest first",
            GRADIENT_IMPORTANCE: "highest first"}
ORDERINGS = ("none", *RANKINGS)
# class-specific maps first; the class-agnostic ones beside them, for comparing their faithfulness
CLASS_METHODS = {
    "relevance": "relevance (Chefer et al.)",
    "attnlrp": "AttnLRP (Achtibat et al.)",
    "legrad": "LeGrad (Bousselham et al.)",
    "grad-rollout": "gradient-weighted rollout",
    "rollout": "attention rollout",
    "cls": "last-layer class attention",
}
CLASS_SPECIFIC = ("relevance", "attnlrp", "legrad", "grad-rollout")  # the methods that need a target class


@dataclass(frozen=True)
class RolloutOptions:
    head_fusion: str = "mean"
    discard_ratio: float = 0.0
    start_layer: int = 0
    residual_weight: float = 0.5


def default_query(analysis: Analysis) -> int | None:
    """The class token when the model has one; else None, the mean over patch queries."""
    return analysis.layout.prefix_names.index("cls") if analysis.layout.has_class_token else None


def query_name(analysis: Analysis, query: int | None) -> str:
    return "mean of patch queries" if query is None else analysis.layout.token_name(query)


def rollout_name(analysis: Analysis, query: int | None) -> str:
    """What ``rollout_map`` follows for ``query``, in words: for a stage of a windowed ViT and no query, the model's
    average pool chained through every stage."""
    if query is None and analysis.stage_windows is not None:
        return "the average pool, through every stage"
    return query_name(analysis, query)


def query_vector(analysis: Analysis, query: int | None) -> torch.Tensor:
    """Weights over query tokens ``[n]``: one-hot, or uniform over patches for None."""
    layout = analysis.layout
    vector = torch.zeros(layout.num_tokens)
    if query is None:
        vector[layout.num_prefix_tokens :] = 1.0 / layout.num_patches
    else:
        vector[check_query(analysis, query)] = 1.0
    return vector


def check_query(analysis: Analysis, query: int) -> int:
    if not 0 <= query < analysis.layout.num_tokens:
        raise VitExplorerError(f"query token {query} is outside 0…{analysis.layout.num_tokens - 1}")
    return query


def query_rows(analysis: Analysis, query: int | None) -> torch.Tensor:
    """Where the query looks in every layer and head ``[layers, heads, n]`` float32, from the analysis's map store
    (for a compact one and a patch query, the rows ``analysis.recompute_query_rows`` handed it)."""
    token = None if query is None else check_query(analysis, query)
    return memo(analysis, ("query_rows", token), lambda: analysis.store.query_rows(token))


def head_statistic(analysis: Analysis, name: str) -> torch.Tensor:
    """One of ``stats.HEAD_STATISTICS`` for this analysis ``[layers, heads]``."""
    return memo(analysis, ("statistic", name), lambda: analysis.store.head_statistic(name))


def ranking_values(analysis: Analysis, name: str, evidence: ClassEvidence | None = None) -> torch.Tensor:
    """The value heads are ranked by ``[layers, heads]``: a head statistic, or the gradient importance
    for ``evidence``'s target class."""
    if name == GRADIENT_IMPORTANCE:
        if evidence is None:
            raise VitExplorerError("ranking heads by gradient importance needs a target class, and this model has no "
                                   "classifier head")
        return evidence.importance
    return head_statistic(analysis, name)


def ranking_keys(analysis: Analysis, name: str, evidence: ClassEvidence | None) -> torch.Tensor:
    """Values whose ascending order is the ranking's order ``[layers, heads]``."""
    if name not in RANKINGS:
        raise VitExplorerError(f"unknown head ranking {name!r}; use one of {', '.join(RANKINGS)}")
    values = ranking_values(analysis, name, evidence)
    return values if RANKINGS[name] != "highest first" else -values


def head_order(analysis: Analysis, order_by: str, evidence: ClassEvidence | None = None) -> torch.Tensor:
    """Per layer, the heads in display order ``[layers, heads]`` int64 (by ``RANKINGS``, or as they are)."""
    layers, heads = analysis.map_shape
    if order_by == "none":
        return torch.arange(heads).repeat(layers, 1)
    return ranking_keys(analysis, order_by, evidence).argsort(dim=1, stable=True)


def top_heads(analysis: Analysis, evidence: ClassEvidence | None, k: int = 5) -> dict[str, list[tuple[int, int, float]]]:
    """By each ranking, the ``k`` first heads of the whole model as (layer, head, value); gradient
    importance only where there is a target class."""
    tops = {}
    for name in RANKINGS:
        if name == GRADIENT_IMPORTANCE and evidence is None:
            continue
        values = ranking_values(analysis, name, evidence)
        flat = ranking_keys(analysis, name, evidence).flatten().argsort(stable=True)[:k].tolist()
        heads = (divmod(index, values.shape[1]) for index in flat)
        tops[name] = [(layer, head, float(values[layer, head])) for layer, head in heads]
    return tops


def rollout_map(analysis: Analysis, query: int | None, options: RolloutOptions) -> torch.Tensor:
    """The query's rollout over the patches ``[grid_h, grid_w]``. The per-layer factors ``[layers, n, n]`` are built from
    the store's blocks of rows (``rollout.block_factors``) once per options and kept, so that another query or start layer
    costs only the row's products."""
    if query is None and analysis.stage_windows is not None:
        return memo(analysis, ("stage rollout", options), lambda: chained_map(
            analysis.stage_windows, "rollout", analysis.grid, options.head_fusion, options.residual_weight,
            options.discard_ratio, options.start_layer))
    if options.head_fusion != "mean" and not analysis.store.keeps_every_head:
        raise VitExplorerError("this analysis kept only head-mean maps to stay within its memory budget, so rollout can fuse "
                               "heads by mean only; raise the memory budget for max or min")
    factors = memo(
        analysis,
        ("rollout_factors", options.head_fusion, options.discard_ratio, options.residual_weight),
        lambda: block_factors(
            analysis.store.head_blocks, analysis.map_shape[0], options.head_fusion, options.discard_ratio,
            options.residual_weight, num_protected=int(analysis.layout.has_class_token),
        ),
    )
    return factors_map(analysis, factors, query, options.start_layer)


def factors_map(analysis: Analysis, factors: torch.Tensor, query: int | None, start_layer: int) -> torch.Tensor:
    """The query's row of a chain of per-layer factors ``[layers, n, n]``, over the patches ``[grid_h, grid_w]``."""
    row = rollout_rows(factors, query_vector(analysis, query)[None], start_layer)[0]
    return analysis.layout.patch_map(row)


def class_map(analysis: Analysis, method: str, evidence: ClassEvidence | None, options: RolloutOptions) -> torch.Tensor:
    """The map of ``method`` (``CLASS_METHODS``) for the default query (class token) ``[grid_h, grid_w]``.

    ``relevance``, ``attnlrp``, ``legrad`` and ``grad-rollout`` are for ``evidence``'s target class (AttnLRP's and
    LeGrad's maps are read from the evidence, where ``class_evidence`` put them when asked: no view runs the model);
    ``rollout`` and ``cls`` are class-agnostic. Discard ratio, residual weight and start layer come from ``options``.
    """
    query = default_query(analysis)
    if method == "rollout":
        return rollout_map(analysis, query, options)
    if method == "cls":
        return attention_map(analysis, query, analysis.map_shape[0] - 1, None)
    if method not in CLASS_METHODS:
        raise VitExplorerError(f"unknown map method {method!r}; use one of {', '.join(CLASS_METHODS)}")
    if evidence is None:  # method is one of CLASS_SPECIFIC
        raise VitExplorerError(f"{CLASS_METHODS[method]} explains a class score, and this model has no classifier head")
    if method in MODEL_MAPS:
        if method not in evidence.method_maps:
            raise VitExplorerError(f"{CLASS_METHODS[method]} takes passes of the model of its own, and they have not run for "
                                   f"{analysis.label(evidence.target)!r}: ask for it first, class_evidence(model, analysis, "
                                   f"target, methods=({method!r},))")
        return evidence.method_maps[method]
    if evidence.stage_windows is not None:
        return memo(analysis, ("stage map", method, evidence.target, options), lambda: chained_map(
            evidence.stage_windows, method, analysis.grid, "mean", options.residual_weight, options.discard_ratio,
            options.start_layer))
    weighted = evidence.weighted
    if method == "relevance":
        factors = memo(analysis, ("relevance_factors", evidence.target), lambda: relevance_factors(weighted))
    else:
        factors = memo(
            analysis,
            ("grad_rollout_factors", evidence.target, options.discard_ratio, options.residual_weight),
            lambda: grad_rollout_factors(weighted, options.discard_ratio, options.residual_weight,
                                         num_protected=int(analysis.layout.has_class_token)),
        )
    return factors_map(analysis, factors, query, options.start_layer)


def output_tokens(analysis: Analysis, layer: int | None = None) -> torch.Tensor:
    """Every token ``[n, dim]`` float32 as the model outputs it (``layer`` None or the last), or after an earlier layer
    through the model's final norm (how DINOv2's intermediate features are read); a message where the analysis was
    made without them."""
    layers = analysis.map_shape[0]
    if layer is not None and not 0 <= layer < layers:
        raise VitExplorerError(f"layer {layer} is out of range: this model has layers 0 to {layers - 1}")
    if layer is None or layer == layers - 1:
        tokens = analysis.output_tokens
    else:
        tokens = None if analysis.layer_tokens is None else analysis.layer_tokens[layer].float()
    if tokens is None:
        raise VitExplorerError("this analysis was made without its output tokens; analyse the image again")
    return tokens


def token_similarity(analysis: Analysis, query: int | None, layer: int | None = None) -> torch.Tensor:
    """The cosine similarity of every patch's token after ``layer`` (None: the output tokens) to the query token's
    (None: to the mean patch token) ``[grid_h, grid_w]``: the plain view of a clicked patch that DINOv2's users know,
    beside which any method that explains a patch target is to be read."""
    tokens = output_tokens(analysis, layer)  # [n, dim]
    layout = analysis.layout
    reference = tokens[layout.num_prefix_tokens :].mean(dim=0) if query is None else tokens[check_query(analysis, query)]
    return layout.patch_map(torch.nn.functional.cosine_similarity(tokens, reference[None], dim=-1))


def token_components(analysis: Analysis, layer: int | None = None) -> torch.Tensor:
    """The first three principal components of the patch tokens after ``layer`` (None: the output tokens), each scaled
    to 0…1 over the patches ``[grid_h, grid_w, 3]`` (DINOv2's own picture of its features: patches alike in colour are
    alike in representation). A component's sign is arbitrary (the SVD's); it is fixed so that its largest value is
    positive."""
    def compute() -> torch.Tensor:
        patches = output_tokens(analysis, layer)[analysis.layout.num_prefix_tokens :].double()  # [patches, dim]
        centred = patches - patches.mean(dim=0)
        _, _, directions = torch.linalg.svd(centred, full_matrices=False)  # rows: principal directions
        components = centred @ directions[:3].T  # [patches, 3]
        components = components * torch.where(components.max(dim=0).values >= -components.min(dim=0).values, 1.0, -1.0)
        low, high = components.min(dim=0).values, components.max(dim=0).values
        scaled = ((components - low) / (high - low).clamp_min(1e-12)).float()
        rows, cols = analysis.grid
        return scaled.reshape(rows, cols, 3)

    last = analysis.map_shape[0] - 1
    return memo(analysis, ("token_components", last if layer is None else layer), compute)


# below this share of the score, a class-specific map explains nothing: measured on the shipped model's six first examples and
# real DINOv2 (astronaut, chelsea; own embedding and an eye patch) every map carries 0.6 to 450 times its score, on
# random-weight DINOv2 (LayerScale 1e-5: the blocks add almost nothing) 2e-7 to 2.4e-3 of it
NEGLIGIBLE = 0.01


def map_strength(analysis: Analysis, method: str, evidence: ClassEvidence | None, grid_map: torch.Tensor) -> float | None:
    """How much of its target's score a class-specific map carries, as a share of |score|; None for a class-agnostic map.

    AttnLRP's relevance is in the score's units and sums to it where conservation holds: Σ|R| over patches. The
    gradient methods (relevance, gradient-weighted rollout, LeGrad) are read off ∇A: Σ|∇A ⊙ A| over every head, the
    first-order part of the score that attention carries. Below ``NEGLIGIBLE``, the map's pattern is noise at full
    contrast, whatever it looks like."""
    if method not in CLASS_SPECIFIC or evidence is None:
        return None
    score = abs(float(analysis.logits[evidence.target]))
    magnitude = float(grid_map.abs().sum()) if method == "attnlrp" else float(evidence.importance.sum())
    return magnitude / score if score > 0 else float("inf")


# AttnLRP's relevance sums to its score where conservation holds; beyond this distance from 1 its red and blue do not add
# up to the score, and the map says so
CONSERVATION_TOLERANCE = 0.25


def conservation(analysis: Analysis, method: str, evidence: ClassEvidence | None, grid_map: torch.Tensor) -> float | None:
    """AttnLRP's relevance summed over the patches over the score it explains (1 where conservation holds); None for
    another method or a score of 0. Biases, the class token and the position embedding keep relevance the rules do not
    pass on to the pixels, so on real weights it can be far from 1."""
    if method != "attnlrp" or evidence is None:
        return None
    score = float(analysis.logits[evidence.target])
    return float(grid_map.sum()) / score if score != 0 else None


def attention_map(analysis: Analysis, query: int | None, layer: int, head: int | None) -> torch.Tensor:
    """Where the query looks in one layer, one head or the mean of heads ``[grid_h, grid_w]``."""
    rows = query_rows(analysis, query)[layer]  # [heads, n]
    return analysis.layout.patch_map(rows.mean(dim=0) if head is None else rows[head])


def query_maps(analysis: Analysis, query: int | None) -> torch.Tensor:
    """Where the query looks in every layer and head, on the patch grid ``[layers, heads, grid_h, grid_w]``."""
    return analysis.layout.patch_map(query_rows(analysis, query))


@dataclass(frozen=True)
class HeadsView:
    """What the layers × heads grid shows: where one query looks in every layer and head, each layer's heads in the
    order a ranking (``ORDERINGS``) gives.

    Attributes:
        query: the query token (None: the mean of patch queries).
        maps: ``[layers, heads, grid_h, grid_w]``, each layer's heads in ``order``.
        order: the head shown at each rank ``[layers, heads]`` int64.
        order_by: the ranking (``ORDERINGS``).
    """

    query: int | None
    maps: torch.Tensor
    order: torch.Tensor
    order_by: str = "none"


def heads_view(analysis: Analysis, query: int | None, order_by: str = "none", evidence: ClassEvidence | None = None) -> HeadsView:
    """The query's ``HeadsView``; ``evidence`` (the target class's) is needed only to order heads by gradient importance."""
    order = head_order(analysis, order_by, evidence)
    ordered = query_maps(analysis, query).take_along_dim(order[:, :, None, None], dim=1)
    return HeadsView(query, ordered, order, order_by)


@dataclass(frozen=True)
class Overview:
    """The first views of an image: for the default query (``default_query``), its rollout and its last layer's mean of
    heads ``[grid_h, grid_w]`` each, and every head's map of it in model order (``HeadsView``, which names the query)."""

    rollout: torch.Tensor
    last_layer: torch.Tensor
    heads: HeadsView


def overview(analysis: Analysis, options: RolloutOptions = RolloutOptions()) -> Overview:
    """The analysis's ``Overview`` under the rollout ``options``."""
    query = default_query(analysis)
    heads = heads_view(analysis, query)
    return Overview(rollout_map(analysis, query, options), attention_map(analysis, query, analysis.map_shape[0] - 1, None), heads)


@dataclass(frozen=True)
class ClassMap:
    """One method's map for its target, with what can be trusted of it.

    Attributes:
        method: the method (``CLASS_METHODS``).
        map: the map over the patch grid ``[grid_h, grid_w]``.
        strength: the share of its target's score it carries (``map_strength``); None for a class-agnostic map.
        conserved: for AttnLRP, its relevance summed over the score (``conservation``); else None.
        variant: how the method ran for this target, in words (LeGrad's layers); else None.
    """

    method: str
    map: torch.Tensor
    strength: float | None = None
    conserved: float | None = None
    variant: str | None = None


def trusted_map(analysis: Analysis, method: str, evidence: ClassEvidence | None, options: RolloutOptions) -> ClassMap:
    """``method``'s map (``class_map``) with its strength, conservation and variant."""
    grid_map = class_map(analysis, method, evidence, options)
    variant = None if evidence is None else evidence.variants.get(method)
    return ClassMap(method, grid_map, map_strength(analysis, method, evidence, grid_map),
                    conservation(analysis, method, evidence, grid_map), variant)


def class_maps(analysis: Analysis, methods: Iterable[str], evidence: ClassEvidence | None,
               options: RolloutOptions) -> dict[str, ClassMap]:
    """Each of ``methods``' ``trusted_map`` by name, in ``CLASS_METHODS``' order; the class-specific ones only with
    ``evidence``."""
    wanted = set(methods)
    return {method: trusted_map(analysis, method, evidence, options) for method in CLASS_METHODS
            if method in wanted and (evidence is not None or method not in CLASS_SPECIFIC)}
