"""What the app and the CLI show, computed from one cached ``Analysis``, never from the model.

Every function here is pure given its arguments; derived arrays that several views reuse
(rollout factors, query rows, head statistics) are memoised on the analysis, bounded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import render, stats
from .analysis import Analysis, ClassEvidence, memo
from .errors import VitExplorerError
from .relevance import grad_rollout_factors, relevance_factors
from .rollout import rollout_factors, rollout_rows

VIEW_PX = 384  # side of the large views
GRADIENT_IMPORTANCE = "gradient importance"
# the direction each ranking lists heads in: focused, local heads first; sinks and important heads first
RANKINGS = {"entropy": "lowest first", "distance": "shortest first", "prefix share": "highest first",
            GRADIENT_IMPORTANCE: "highest first"}
ORDERINGS = ("none", *RANKINGS)
# class-specific maps first; the class-agnostic ones beside them, for comparing their faithfulness
CLASS_METHODS = {
    "relevance": "relevance (Chefer et al.)",
    "grad-rollout": "gradient-weighted rollout",
    "rollout": "attention rollout",
    "cls": "last-layer class attention",
}
CLASS_SPECIFIC = ("relevance", "grad-rollout")  # the methods that need a target class


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


def query_vector(analysis: Analysis, query: int | None) -> np.ndarray:
    """Weights over query tokens ``[n]``: one-hot, or uniform over patches for None."""
    layout = analysis.layout
    vector = np.zeros(layout.num_tokens, dtype=np.float32)
    if query is None:
        vector[layout.num_prefix_tokens :] = 1.0 / layout.num_patches
    else:
        vector[check_query(analysis, query)] = 1.0
    return vector


def check_query(analysis: Analysis, query: int) -> int:
    if not 0 <= query < analysis.layout.num_tokens:
        raise VitExplorerError(f"query token {query} is outside 0…{analysis.layout.num_tokens - 1}")
    return query


def query_rows(analysis: Analysis, query: int | None) -> np.ndarray:
    """Where the query looks in every layer and head ``[layers, heads, n]``."""

    def compute() -> np.ndarray:
        token = None if query is None else check_query(analysis, query)
        if analysis.attentions is None:  # compact: reduced at capture, or recomputed with a forward pass
            if token is None:
                return analysis.compact["patch_mean_rows"].astype(np.float32)
            if token < analysis.num_prefix_tokens:
                return analysis.compact["prefix_rows"][:, :, token, :].astype(np.float32)
            return analysis.row_source(token)
        if token is None:
            return analysis.attentions[:, :, analysis.num_prefix_tokens :, :].mean(axis=2, dtype=np.float32)
        return np.ascontiguousarray(analysis.attentions[:, :, token, :], dtype=np.float32)

    return memo(analysis, ("query_rows", query), compute)


def head_statistic(analysis: Analysis, name: str) -> np.ndarray:
    """One of ``stats.HEAD_STATISTICS`` for this analysis ``[layers, heads]``."""
    if name not in stats.HEAD_STATISTICS:
        raise VitExplorerError(f"unknown head statistic {name!r}; use one of {', '.join(stats.HEAD_STATISTICS)}")
    if analysis.attentions is None:
        return analysis.compact["statistics"][name]
    return memo(analysis, ("statistic", name), lambda: stats.HEAD_STATISTICS[name](analysis.attentions, analysis.layout))


def ranking_values(analysis: Analysis, name: str, evidence: ClassEvidence | None = None) -> np.ndarray:
    """The value heads are ranked by ``[layers, heads]``: a head statistic, or the gradient importance
    for ``evidence``'s target class."""
    if name == GRADIENT_IMPORTANCE:
        if evidence is None:
            raise VitExplorerError("ranking heads by gradient importance needs a target class, and this model has no classifier head")
        return evidence.importance
    return head_statistic(analysis, name)


def ranking_keys(analysis: Analysis, name: str, evidence: ClassEvidence | None) -> np.ndarray:
    """Values whose ascending order is the ranking's order ``[layers, heads]``."""
    if name not in RANKINGS:
        raise VitExplorerError(f"unknown head ranking {name!r}; use one of {', '.join(RANKINGS)}")
    values = ranking_values(analysis, name, evidence)
    return values if RANKINGS[name] != "highest first" else -values


def head_order(analysis: Analysis, order_by: str, evidence: ClassEvidence | None = None) -> np.ndarray:
    """Per layer, the heads in display order ``[layers, heads]`` (by ``RANKINGS``, or as they are)."""
    layers, heads = analysis.map_shape
    if order_by == "none":
        return np.tile(np.arange(heads), (layers, 1))
    return np.argsort(ranking_keys(analysis, order_by, evidence), axis=1, kind="stable")


def top_heads(analysis: Analysis, evidence: ClassEvidence | None, k: int = 5) -> dict[str, list[tuple[int, int, float]]]:
    """By each ranking, the ``k`` first heads of the whole model as (layer, head, value); gradient
    importance only where there is a target class."""
    tops = {}
    for name in RANKINGS:
        if name == GRADIENT_IMPORTANCE and evidence is None:
            continue
        values = ranking_values(analysis, name, evidence)
        flat = np.argsort(ranking_keys(analysis, name, evidence), axis=None, kind="stable")[:k]
        tops[name] = [(int(layer), int(head), float(values[layer, head])) for layer, head in zip(*np.unravel_index(flat, values.shape))]
    return tops


def rollout_map(analysis: Analysis, query: int | None, options: RolloutOptions) -> np.ndarray:
    """The query's rollout over the patches ``[grid_h, grid_w]``."""
    attentions = analysis.attentions
    if attentions is None:  # compact: only the head means were kept, as one "head"
        if options.head_fusion != "mean":
            raise VitExplorerError(
                "this analysis kept only head-mean maps to stay within its memory budget, so rollout can fuse heads "
                "by mean only; raise the memory budget for max or min"
            )
        attentions = analysis.compact["head_mean"][:, None]
    factors = memo(
        analysis,
        ("rollout_factors", options.head_fusion, options.discard_ratio, options.residual_weight),
        lambda: rollout_factors(
            attentions, options.head_fusion, options.discard_ratio, options.residual_weight,
            num_protected=int(analysis.layout.has_class_token),
        ),
    )
    return factors_map(analysis, factors, query, options.start_layer)


def factors_map(analysis: Analysis, factors: torch.Tensor, query: int | None, start_layer: int) -> np.ndarray:
    """The query's row of a chain of per-layer factors ``[layers, n, n]``, over the patches ``[grid_h, grid_w]``."""
    row = rollout_rows(factors, torch.from_numpy(query_vector(analysis, query))[None], start_layer)[0]
    return analysis.layout.patch_map(row.numpy())


def class_map(analysis: Analysis, method: str, evidence: ClassEvidence | None, options: RolloutOptions) -> np.ndarray:
    """The map of ``method`` (``CLASS_METHODS``) for the default query (class token) ``[grid_h, grid_w]``.

    ``relevance`` and ``grad-rollout`` are for ``evidence``'s target class; ``rollout`` and ``cls``
    are class-agnostic. Discard ratio, residual weight and start layer come from ``options``.
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
    weighted = torch.from_numpy(evidence.weighted)
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


def attention_map(analysis: Analysis, query: int | None, layer: int, head: int | None) -> np.ndarray:
    """Where the query looks in one layer, one head or the mean of heads ``[grid_h, grid_w]``."""
    rows = query_rows(analysis, query)[layer]  # [heads, n]
    return analysis.layout.patch_map(rows.mean(axis=0) if head is None else rows[head])


def patch_box(analysis: Analysis, token: int | None, picture_hw: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """Pixel box (x0, y0, x1, y1) of a patch token in a picture of ``picture_hw``, None for others."""
    patch = None if token is None else analysis.layout.token_patch(token)
    if patch is None:
        return None
    rows, cols = analysis.grid
    cell_h, cell_w = picture_hw[0] / rows, picture_hw[1] / cols
    return (int(patch[1] * cell_w), int(patch[0] * cell_h), int((patch[1] + 1) * cell_w) - 1, int((patch[0] + 1) * cell_h) - 1)


def view_hw(analysis: Analysis, side: int = VIEW_PX) -> tuple[int, int]:
    """Display size of a large view with the image's aspect ratio, longer side ``side``."""
    height, width = analysis.image.shape[:2]
    scale = side / max(height, width)
    return (round(height * scale), round(width * scale))


def token_at(analysis: Analysis, x: float, y: float, picture_hw: tuple[int, int]) -> int:
    """The patch token under pixel (x, y) of a picture of ``picture_hw`` showing the image."""
    rows, cols = analysis.grid
    row = min(rows - 1, max(0, int(y * rows / picture_hw[0])))
    col = min(cols - 1, max(0, int(x * cols / picture_hw[1])))
    return analysis.layout.patch_token(row, col)


def map_picture(analysis: Analysis, grid_map: np.ndarray, *, cmap: str, overlay: bool, query: int | None, label: str) -> np.ndarray:
    """A large view of one ``[grid_h, grid_w]`` map, query patch outlined, with a colour bar."""
    size = view_hw(analysis)
    picture = render.heat(grid_map, size, cmap, image=analysis.image if overlay else None)
    box = patch_box(analysis, query, size)
    if box is not None:
        picture = render.outline(picture, box)
    return render.with_colorbar(picture, cmap, float(grid_map.min()), float(grid_map.max()), label)


def image_picture(analysis: Analysis, query: int | None) -> np.ndarray:
    """The image as the model saw it, at display size, with the query patch outlined."""
    size = view_hw(analysis)
    picture = render.resize_image(analysis.image, size)
    box = patch_box(analysis, query, size)
    return render.outline(picture, box) if box is not None else picture


def grid_picture(
    analysis: Analysis,
    query: int | None,
    *,
    cmap: str = "inferno",
    overlay: bool = True,
    shared: bool = False,
    order_by: str = "none",
    evidence: ClassEvidence | None = None,
    selected: tuple[int, int] | None = None,
    tile_px: int | None = None,
) -> tuple[np.ndarray, render.GridGeometry, np.ndarray]:
    """The layers × heads grid of the query's attention: picture, geometry, head order ``[layers, heads]``.

    ``evidence`` is the target class's, for ordering by gradient importance. ``selected`` is
    (layer, head); it is outlined wherever the ordering put that head.
    """
    layers, heads = analysis.map_shape
    tile_px = tile_px or int(np.clip(720 // max(heads, 1), 40, 96))
    order = head_order(analysis, order_by, evidence)
    maps = analysis.layout.patch_map(query_rows(analysis, query))  # [layers, heads, gh, gw]
    maps = np.take_along_axis(maps, order[:, :, None, None], axis=1)
    tiles = render.heat(maps, (tile_px, tile_px), cmap, image=analysis.image if overlay else None, shared=shared)
    highlight = None
    if selected is not None:
        layer, head = selected
        highlight = (layer, int(np.nonzero(order[layer] == head)[0][0]))
    ordered = order_by != "none"
    picture, geometry = render.tile_grid(
        tiles,
        row_labels=[f"L{layer}" for layer in range(layers)],
        col_labels=[f"#{rank + 1}" if ordered else f"h{rank}" for rank in range(heads)],
        axis_names=("layer", f"head by {order_by}" if ordered else "head"),
        tile_notes=[[f"h{head}" for head in order[layer]] for layer in range(layers)] if ordered else None,
        highlight=highlight,
    )
    return picture, geometry, order
