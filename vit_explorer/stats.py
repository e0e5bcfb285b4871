"""Per-head statistics of attention ``[..., heads, n, n]`` (one image's layers, or a batch): entropy, distance,
prefix share. Each gives ``[..., heads]``, computed in torch (every core, and the GPU a dataset's batch is on)
and returned as the maps came: numpy for numpy, a tensor for a tensor."""

from __future__ import annotations

import numpy as np
import torch

from .layout import TokenLayout


def _tensor(attentions: np.ndarray | torch.Tensor) -> torch.Tensor:
    """The maps as a float32 tensor: a numpy array without a copy where it is float32 already."""
    return torch.as_tensor(attentions).to(torch.float32)


def _like(result: torch.Tensor, attentions: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """``result`` as the caller's kind: numpy for numpy maps, a tensor for tensors."""
    return result.numpy() if isinstance(attentions, np.ndarray) else result


def attention_entropy(attentions: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """Mean entropy (nats) of each head's rows ``[..., heads]``; log(n) is uniform, 0 is one-hot."""
    maps = _tensor(attentions)
    # -Σ p·log p as one log pass and one fused dot per row: about twice as fast as ``torch.special.entr``, which
    # dominates a dataset run's statistics; a weight of exactly 0 contributes 0·log(tiny) = 0, as it should
    logs = maps.clamp_min(torch.finfo(maps.dtype).tiny).log_()
    return _like(torch.linalg.vecdot(maps, logs).mean(dim=-1).neg_(), attentions)


def patch_distances(layout: TokenLayout) -> np.ndarray:
    """Pixel distance between the centres of every pair of patches ``[patches, patches]``."""
    rows, cols = np.divmod(np.arange(layout.num_patches), layout.grid_hw[1])
    ys, xs = rows * layout.patch_hw[0], cols * layout.patch_hw[1]
    return np.hypot(ys[:, None] - ys[None, :], xs[:, None] - xs[None, :]).astype(np.float32)


def mean_attention_distance(attentions: np.ndarray | torch.Tensor, layout: TokenLayout) -> np.ndarray | torch.Tensor:
    """Mean distance in input pixels over which each head integrates ``[..., heads]``.

    For every patch query, the expected distance to the patch keys it attends to (weights
    renormalised over patches, so attention parked on prefix tokens does not count as distance
    zero), averaged over queries — the measure of Fig. 7 of the ViT paper.
    """
    prefix = layout.num_prefix_tokens
    patch_to_patch = _tensor(attentions)[..., prefix:, prefix:]  # [..., heads, patches, patches]
    # Σ_k A[q, k]·d(q, k) / Σ_k A[q, k]: the renormalisation divides the sum, not each weight
    weighted = torch.linalg.vecdot(patch_to_patch, torch.from_numpy(patch_distances(layout)).to(patch_to_patch.device))
    return _like((weighted / patch_to_patch.sum(dim=-1).clamp_min(1e-12)).mean(dim=-1), attentions)


def prefix_share(attentions: np.ndarray | torch.Tensor, layout: TokenLayout) -> np.ndarray | torch.Tensor:
    """Share of each head's attention from patch queries that lands on prefix tokens ``[..., heads]``."""
    prefix = layout.num_prefix_tokens
    return _like(_tensor(attentions)[..., prefix:, :prefix].sum(dim=-1).mean(dim=-1), attentions)


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks of the flattened ``values`` (0 = smallest), ties sharing their mean rank ``[values.size]``."""
    flat = np.asarray(values, dtype=np.float64).ravel()
    order = np.argsort(flat, kind="stable")
    sorted_values = flat[order]
    # each run of equal values gets the mean of the positions it spans
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], flat.size]
    mean_positions = np.repeat((starts + ends - 1) / 2.0, ends - starts)
    result = np.empty_like(flat)
    result[order] = mean_positions
    return result


def spearman(first: np.ndarray, second: np.ndarray) -> float:
    """Spearman rank correlation of two arrays of the same size (flattened), NaN when either is constant."""
    first_ranks, second_ranks = ranks(first), ranks(second)
    if first_ranks.size != second_ranks.size:
        raise ValueError(f"spearman needs arrays of one size, not {first_ranks.size} and {second_ranks.size}")
    first_ranks -= first_ranks.mean()
    second_ranks -= second_ranks.mean()
    scale = np.sqrt((first_ranks**2).sum() * (second_ranks**2).sum())
    return float((first_ranks * second_ranks).sum() / scale) if scale > 0 else float("nan")


HEAD_STATISTICS = {
    "entropy": lambda attentions, layout: attention_entropy(attentions),
    "distance": mean_attention_distance,
    "prefix share": prefix_share,
}
