"""Attention rollout (Abnar & Zuidema, 2020) and the maps views read off attention rows.

Pure tensor math: inputs are ``[layers, heads, n, n]`` attention stacks, outputs torch tensors. A numpy array is
refused with the one call that converts it, so that no function here has to ask which library it was given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from vit_explorer.errors import VitExplorerError

HEAD_FUSIONS = ("mean", "max", "min")


def as_attention_stack(attentions: torch.Tensor) -> torch.Tensor:
    """``[layers, heads, n, n]`` as a float32 tensor (float16 maps are widened here)."""
    if not isinstance(attentions, torch.Tensor):
        raise VitExplorerError(f"expected attentions as a torch tensor [layers, heads, n, n], got {type(attentions).__name__}; "
                               "convert a numpy array with torch.from_numpy(array)")
    if attentions.ndim != 4 or attentions.shape[-1] != attentions.shape[-2]:
        raise VitExplorerError(f"expected attentions [layers, heads, n, n], got shape {tuple(attentions.shape)}")
    return attentions.float()


def fuse_heads(attentions: torch.Tensor, head_fusion: str = "mean") -> torch.Tensor:
    """``[layers, heads, n, n]`` → ``[layers, n, n]`` by mean, max or min over heads."""
    return fused_rows(as_attention_stack(attentions), head_fusion, dim=1)


def fused_rows(rows: torch.Tensor, head_fusion: str, dim: int = 0) -> torch.Tensor:
    """Rows of maps fused over their head axis ``dim`` by mean, max or min (``fuse_heads`` of a whole stack, or a block of
    one layer's rows ``[heads, r, n]`` → ``[r, n]``)."""
    if head_fusion == "mean":
        return rows.mean(dim=dim)
    if head_fusion == "max":
        return rows.amax(dim=dim)
    if head_fusion == "min":
        return rows.amin(dim=dim)
    raise VitExplorerError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")


def discard_lowest(fused: torch.Tensor, discard_ratio: float, num_protected: int = 1) -> torch.Tensor:
    """Zero the lowest ``discard_ratio`` share of each row's weights ``[..., n, n]``.

    The first ``num_protected`` columns (the class token) are never discarded, so a row always keeps
    the path to the class token.
    """
    if not 0.0 <= discard_ratio < 1.0:
        raise VitExplorerError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    num_discard = int(fused.shape[-1] * discard_ratio)
    if num_discard == 0:
        return fused
    ranking = fused.clone()
    ranking[..., :num_protected] = float("inf")
    lowest = ranking.topk(num_discard, dim=-1, largest=False).indices
    return fused.scatter(-1, lowest, 0.0)


def mixed_rows(fused: torch.Tensor, first: int = 0, discard_ratio: float = 0.0, residual_weight: float = 0.5,
               num_protected: int = 1) -> torch.Tensor:
    """Rows ``first …`` of the factors Â = rownorm((1−w)·discard(fused) + w·I) from the same rows of the head-fused maps
    ``[..., r, n]``: a layer's whole factor for ``first`` 0 and every row, or one block of its rows."""
    if not 0.0 <= residual_weight <= 1.0:
        raise VitExplorerError(f"residual_weight must be in [0, 1], got {residual_weight}")
    # w·I added to the diagonal in place, the same values as adding the matrix: at 1370 tokens each [layers, n, n]
    # temporary is 90 MB
    mixed = (1.0 - residual_weight) * discard_lowest(fused, discard_ratio, num_protected)
    mixed[..., first : first + mixed.shape[-2]].diagonal(dim1=-2, dim2=-1).add_(residual_weight)
    # each row is a distribution over keys: normalise along the key axis, keeping it for broadcasting
    return mixed.div_(mixed.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(mixed.dtype).tiny))


def rollout_factors(
    attentions: torch.Tensor,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    residual_weight: float = 0.5,
    num_protected: int = 1,
) -> torch.Tensor:
    """The per-layer factors Â_l = rownorm((1−w)·fuse(A_l) + w·I) ``[layers, n, n]``."""
    return mixed_rows(fuse_heads(attentions, head_fusion), 0, discard_ratio, residual_weight, num_protected)


def block_factors(head_blocks: Callable[[int], Iterable[tuple[int, torch.Tensor]]], num_layers: int, head_fusion: str = "mean",
                  discard_ratio: float = 0.0, residual_weight: float = 0.5, num_protected: int = 1) -> torch.Tensor:
    """``rollout_factors`` from each layer's maps read in blocks of rows (``head_blocks(layer)`` yields (first row, every
    head's rows ``[heads, r, n]``)): the factors ``[layers, n, n]`` (one n × n per layer, where the maps are one per head)
    without any layer's every head held at once."""
    factors = None
    for layer in range(num_layers):
        for first, block in head_blocks(layer):
            rows = mixed_rows(fused_rows(block, head_fusion), first, discard_ratio, residual_weight, num_protected)  # [r, n]
            if factors is None:
                factors = rows.new_empty(num_layers, rows.shape[-1], rows.shape[-1])
            factors[layer, first : first + rows.shape[0]] = rows
    return factors


def check_start_layer(start_layer: int, num_layers: int) -> None:
    if not 0 <= start_layer < num_layers:
        raise VitExplorerError(f"start_layer must be in 0…{num_layers - 1}, got {start_layer}")


def attention_rollout(
    attentions: torch.Tensor,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    residual_weight: float = 0.5,
    num_protected: int = 1,
) -> torch.Tensor:
    """The full rollout R = Â_L ⋯ Â_start ``[n, n]``; row i says how token i's output draws on each input token."""
    factors = rollout_factors(attentions, head_fusion, discard_ratio, residual_weight, num_protected)
    check_start_layer(start_layer, factors.shape[0])
    result = factors[start_layer]
    for factor in factors[start_layer + 1 :]:
        result = factor @ result
    return result


def rollout_rows(factors: torch.Tensor, queries: torch.Tensor, start_layer: int = 0) -> torch.Tensor:
    """Rows of the rollout for query weights ``[q, n]`` from the factors ``[layers, n, n]``: O(layers·q·n²).

    A one-hot query row gives that token's rollout row; a mean over patch rows gives the patch-mean row.
    """
    check_start_layer(start_layer, factors.shape[0])
    rows = queries.to(factors.dtype)
    for layer in range(factors.shape[0] - 1, start_layer - 1, -1):  # the last layer first
        rows = rows @ factors[layer]
    return rows


def rollout_row(
    attentions: torch.Tensor,
    query: int,
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    start_layer: int = 0,
    residual_weight: float = 0.5,
    num_protected: int = 1,
) -> torch.Tensor:
    """Row ``query`` of ``attention_rollout`` ``[n]``, without forming the n×n product."""
    factors = rollout_factors(attentions, head_fusion, discard_ratio, residual_weight, num_protected)
    one_hot = torch.zeros(1, factors.shape[-1], dtype=factors.dtype)
    one_hot[0, query] = 1.0
    return rollout_rows(factors, one_hot, start_layer)[0]


