"""Per-head statistics of attention ``[..., heads, n, n]`` (one image's layers, or a batch): entropy, distance,
prefix share. Each gives ``[..., heads]``: torch in, torch out, on the device the maps are on (every core, and
the GPU a dataset's batch is on)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vit_explorer.models.layout import TokenLayout

# A dataset batch's maps are tens of MB: a statistic that made a temporary of that size would pay a page
# fault per 4 KiB and a trip to memory per pass, which cost four times the arithmetic. So each statistic
# reads the maps in groups of about this many bytes, which stay in cache while it passes over them twice.
GROUP_BYTES = 2 << 20


def _per_map(maps: torch.Tensor, reduce: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``reduce`` (float32 maps ``[m, n, n]`` → ``[k, m]``) over every map of ``[..., n, n]``, giving ``[k, ...]``."""
    flat = maps.reshape(-1, *maps.shape[-2:])  # [maps, n, n]
    step = max(1, GROUP_BYTES // (flat[0].numel() * 4)) if len(flat) else 1
    values = torch.cat([reduce(group.to(torch.float32)) for group in flat.split(step)], dim=1)  # [k, maps]
    return values.view(-1, *maps.shape[:-2])


def _entropy(rows: torch.Tensor) -> torch.Tensor:
    # -Σ p·log p as one log pass and one fused dot per row (``torch.special.entr`` is twice as slow); a weight
    # of exactly 0 contributes 0·log(tiny) = 0, as it should
    logs = rows.clamp_min(torch.finfo(rows.dtype).tiny).log_()
    return torch.linalg.vecdot(rows, logs).neg_()  # [m, r]


def block_sums(rows: torch.Tensor, first: int, layout: TokenLayout, distances: torch.Tensor) -> torch.Tensor:
    """Each statistic of ``HEAD_STATISTICS`` summed over the rows of a block of maps ``[m, r, n]`` (float32) whose rows are
    the queries ``first … first + r - 1`` ``[3, m]``: the entropy over every row, the distance and the prefix share over
    the patch rows (what ``statistic_rows`` counts), so that a map read in blocks of rows gives, summed over its blocks, what
    the whole map gives. ``distances`` are ``patch_distances``."""
    prefix = layout.num_prefix_tokens
    entropy = _entropy(rows).sum(dim=-1)
    patch_rows = rows[:, max(prefix - first, 0):]  # [m, patch queries in the block, n]
    first_patch = max(first, prefix) - prefix
    to_patches = patch_rows[:, :, prefix:]
    # Σ_k A[q, k]·d(q, k) / Σ_k A[q, k]: the renormalisation divides the sum, not each weight, so that attention parked on
    # prefix tokens does not count as distance zero
    weighted = torch.linalg.vecdot(to_patches, distances[first_patch : first_patch + patch_rows.shape[1]])
    distance = (weighted / to_patches.sum(dim=-1).clamp_min(1e-12)).sum(dim=-1)
    share = patch_rows[:, :, :prefix].sum(dim=(-2, -1))
    return torch.stack([entropy, distance, share])


def statistic_rows(layout: TokenLayout) -> torch.Tensor:
    """How many rows each statistic of ``HEAD_STATISTICS`` averages over ``[3]``: every query, the patch queries twice."""
    return torch.tensor([layout.num_tokens, layout.num_patches, layout.num_patches], dtype=torch.float32)


def attention_entropy(attentions: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of each head's rows ``[..., heads]``; log(n) is uniform, 0 is one-hot."""
    return _per_map(attentions, lambda maps: _entropy(maps).mean(dim=-1)[None])[0]


def patch_distances(layout: TokenLayout, device: torch.device | str = "cpu") -> torch.Tensor:
    """Pixel distance between the centres of every pair of patches ``[patches, patches]`` float32."""
    index = torch.arange(layout.num_patches, device=device)
    ys = (index // layout.grid_hw[1] * layout.patch_hw[0]).float()
    xs = (index % layout.grid_hw[1] * layout.patch_hw[1]).float()
    return torch.hypot(ys[:, None] - ys[None, :], xs[:, None] - xs[None, :])


def mean_attention_distance(attentions: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """Mean distance in input pixels over which each head integrates ``[..., heads]``.

    For every patch query, the expected distance to the patch keys it attends to (weights
    renormalised over patches, so attention parked on prefix tokens does not count as distance
    zero), averaged over queries — the measure of Fig. 7 of the ViT paper.
    """
    return head_statistics(attentions, layout)["distance"]


def prefix_share(attentions: torch.Tensor, layout: TokenLayout) -> torch.Tensor:
    """Share of each head's attention from patch queries that lands on prefix tokens ``[..., heads]``."""
    return head_statistics(attentions, layout)["prefix share"]


def head_statistics(attentions: torch.Tensor, layout: TokenLayout) -> dict[str, torch.Tensor]:
    """Every statistic of ``HEAD_STATISTICS`` ``{name: [..., heads]}``, from one read of each group of maps
    (what capture's statistics sinks use: a dataset batch's maps come from memory once, not once per statistic)."""
    distances, counts = patch_distances(layout, attentions.device), statistic_rows(layout).to(attentions.device)
    values = _per_map(attentions, lambda maps: block_sums(maps, 0, layout, distances) / counts[:, None])
    return dict(zip(HEAD_STATISTICS, values, strict=True))


def ranks(values: torch.Tensor) -> torch.Tensor:
    """Ranks of the flattened ``values`` (0 = smallest), ties sharing their mean rank ``[values.numel()]`` float64."""
    flat = values.detach().reshape(-1).to(torch.float64).cpu()
    order = flat.argsort(stable=True)
    sorted_values = flat[order]
    # each run of equal values gets the mean of the positions it spans
    starts = torch.cat([torch.tensor([True]), sorted_values[1:] != sorted_values[:-1]]).nonzero().flatten()
    ends = torch.cat([starts[1:], torch.tensor([flat.numel()])])
    mean_positions = ((starts + ends - 1) / 2.0).to(torch.float64).repeat_interleave(ends - starts)
    result = torch.empty_like(flat)
    result[order] = mean_positions
    return result


def spearman(first: torch.Tensor, second: torch.Tensor) -> float:
    """Spearman rank correlation of two tensors of the same size (flattened), NaN when either is constant."""
    first_ranks, second_ranks = ranks(first), ranks(second)
    if first_ranks.numel() != second_ranks.numel():
        raise ValueError(f"spearman needs tensors of one size, not {first_ranks.numel()} and {second_ranks.numel()}")
    first_ranks -= first_ranks.mean()
    second_ranks -= second_ranks.mean()
    scale = ((first_ranks**2).sum() * (second_ranks**2).sum()).sqrt()
    return float((first_ranks * second_ranks).sum() / scale) if scale > 0 else float("nan")


# the per-head statistics, in the order ``block_sums`` and ``head_statistics`` give them
HEAD_STATISTICS = ("entropy", "distance", "prefix share")


STATISTIC_UNITS = {"entropy": "nats", "distance": "input pixels", "prefix share": "share of attention"}


@dataclass(frozen=True)
class DatasetStatistics:
    """What ``vit-explorer stats`` wrote into a folder, per statistic of ``HEAD_STATISTICS`` and per head
    ``[layers, heads]``: the mean and the 5% and 95% quantiles over the dataset's images."""

    folder: str
    model: str
    source: str
    images: int
    mean: dict[str, torch.Tensor]  # [layers, heads] float64, and so low and high
    low: dict[str, torch.Tensor]
    high: dict[str, torch.Tensor]

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(next(iter(self.mean.values())).shape)

    def outside(self, name: str, values: torch.Tensor) -> list[tuple[int, int, float, float, float]]:
        """The heads whose ``values`` ``[layers, heads]`` (an analysis's, ``maps.ranking_values``) of statistic ``name``
        lie outside the dataset's 5–95% range: (layer, head, value, low, high), furthest outside first (in units of
        the range)."""
        low, high = self.low[name], self.high[name]
        values = values.double()
        beyond = torch.maximum(low - values, values - high) / (high - low).clamp_min(1e-12)  # [layers, heads], > 0 outside
        heads = [(layer, head) for layer, head in (beyond > 0).nonzero().tolist()]
        heads.sort(key=lambda pair: -float(beyond[pair]))
        return [(layer, head, float(values[layer, head]), float(low[layer, head]), float(high[layer, head])) for layer,
                head in heads]
