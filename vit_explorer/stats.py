"""Per-head statistics of attention ``[..., heads, n, n]`` (one image's layers, or a batch): entropy, distance,
prefix share. Each gives ``[..., heads]``."""

from __future__ import annotations

import numpy as np

from .layout import TokenLayout


def attention_entropy(attentions: np.ndarray) -> np.ndarray:
    """Mean entropy (nats) of each head's rows ``[..., heads]``; log(n) is uniform, 0 is one-hot."""
    probs = np.asarray(attentions, dtype=np.float32)
    logs = np.log(np.clip(probs, 1e-12, None))
    return -(probs * logs).sum(axis=-1).mean(axis=-1)


def patch_distances(layout: TokenLayout) -> np.ndarray:
    """Pixel distance between the centres of every pair of patches ``[patches, patches]``."""
    rows, cols = np.divmod(np.arange(layout.num_patches), layout.grid_hw[1])
    ys, xs = rows * layout.patch_hw[0], cols * layout.patch_hw[1]
    return np.hypot(ys[:, None] - ys[None, :], xs[:, None] - xs[None, :]).astype(np.float32)


def mean_attention_distance(attentions: np.ndarray, layout: TokenLayout) -> np.ndarray:
    """Mean distance in input pixels over which each head integrates ``[..., heads]``.

    For every patch query, the expected distance to the patch keys it attends to (weights
    renormalised over patches, so attention parked on prefix tokens does not count as distance
    zero), averaged over queries — the measure of Fig. 7 of the ViT paper.
    """
    prefix = layout.num_prefix_tokens
    patch_to_patch = np.asarray(attentions, dtype=np.float32)[..., prefix:, prefix:]
    weights = patch_to_patch / np.clip(patch_to_patch.sum(axis=-1, keepdims=True), 1e-12, None)
    return (weights * patch_distances(layout)).sum(axis=-1).mean(axis=-1)


def prefix_share(attentions: np.ndarray, layout: TokenLayout) -> np.ndarray:
    """Share of each head's attention from patch queries that lands on prefix tokens ``[..., heads]``."""
    prefix = layout.num_prefix_tokens
    return np.asarray(attentions, dtype=np.float32)[..., prefix:, :prefix].sum(axis=-1).mean(axis=-1)


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
