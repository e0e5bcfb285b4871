"""What changing the model's computation does: each head removed in turn (``HeadAblation``, with its modes and its
cost), and a second image's heads or tokens patched into the first's (``Patching``). Plain data with the arithmetic that
reads it; ``methods.ablation`` and ``methods.patching`` compute them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch

from vit_explorer.core import statistics
from vit_explorer.models.layout import TokenLayout


@dataclass(frozen=True)
class HeadAblation:
    """The effect of removing each head, alone, on one image's target class.

    Attributes:
        mode: one of ``ABLATION_MODES``.
        target: the class index.
        delta_logit: ablated minus original target logit ``[layers, heads]``.
        delta_probability: ablated minus original target probability ``[layers, heads]``.
        original_logit: the target logit with every head in place.
        original_probability: the target probability with every head in place.
        forward_passes: model forward passes it took.
        single_score: the model gives one score (a backbone's similarity target, ``core.targets``), whose softmax is 1
            whatever the heads: heads are then measured by the score itself.
    """

    mode: str
    target: int
    delta_logit: torch.Tensor
    delta_probability: torch.Tensor
    original_logit: float
    original_probability: float
    forward_passes: int
    single_score: bool = False

    @property
    def measure(self) -> str:
        """What a head's drop is a drop of: the target's probability, or its score where it is the only one."""
        return "score" if self.single_score else "probability"

    @property
    def delta(self) -> torch.Tensor:
        """The change of ``measure`` when each head is removed ``[layers, heads]``."""
        return self.delta_logit if self.single_score else self.delta_probability

    @property
    def drop(self) -> torch.Tensor:
        """How much removing each head lowers the target probability (the score, for a single score) ``[layers, heads]``
        (negative: raises it); the "ablation effect" ranking lists heads highest first."""
        return -self.delta

    def ranked(self, k: int | None = None) -> list[tuple[int, int, float]]:
        """The ``k`` heads (all for None) whose removal lowers the target probability most, as (layer, head, drop)."""
        drop = self.drop
        flat = (-drop).flatten().argsort(stable=True)[:k].tolist()
        return [(layer, head, float(drop[layer, head])) for layer, head in (divmod(index, drop.shape[1]) for index in flat)]

    def spearman(self, importance: torch.Tensor) -> float:
        """Spearman correlation of |Δ probability| (|Δ score| for a single score) with a per-head score ``[layers, heads]``
        (gradient importance)."""
        return statistics.spearman(self.delta.abs(), importance)

    def as_dict(self, importance: torch.Tensor | None = None) -> dict:
        """Plain values; with the gradient ``importance`` ``[layers, heads]`` of the same target, also its
        Spearman correlation with |Δ probability| (None where either is constant)."""
        record = {"mode": self.mode, "mode_means": ABLATION_MODES[self.mode], "target": self.target,
                  "original_logit": self.original_logit,
                  "original_probability": self.original_probability, "forward_passes": self.forward_passes,
                  "forward_equivalents": forward_equivalents(*self.delta_logit.shape),
                  "delta_logit": self.delta_logit.round(decimals=7).tolist(),
                  "delta_probability": self.delta_probability.round(decimals=7).tolist(),
                  "ranked_by": self.measure,
                  "ranked_by_drop": [{"layer": layer, "head": head, "drop": drop} for layer, head, drop in self.ranked()]}
        if importance is not None:
            correlation = self.spearman(importance)
            record["spearman_abs_delta_probability_vs_gradient_importance"] = None if math.isnan(correlation) else correlation
        return record

    def to_json(self, importance: torch.Tensor | None = None) -> str:
        return json.dumps(self.as_dict(importance), indent=2) + "\n"

ABLATION_MODES = {
    "zero": "the head's output set to zero",
    "mean": "the head's map replaced by its mean over a reference set (uniform without one)",
}


def forward_equivalents(layers: int, heads: int) -> float:
    """What one ablation costs, in multiples of one plain forward pass of one image: layer evaluations
    (``methods.ablation``'s doc: L + Σ_l (l + H·(L − l))) over the L of one pass. "1 + layers passes" undersells it: each
    branched pass runs H copies of every layer from its branch point up."""
    evaluations = layers + sum(layer + heads * (layers - layer) for layer in range(layers))
    return evaluations / layers


@dataclass(frozen=True)
class Patching:
    """A's target score with one part of its computation taken from B, minus A's own (``methods.patching``).

    Attributes:
        target, label: the target (A's class index, or 0 for a backbone's similarity) and its name.
        score_a, score_b: the target's score on A and on B (the same model, the same target).
        heads: with each head's output at each layer from B ``[layers, heads]``.
        tokens: with the residual stream after each layer at each token from B ``[layers, n]``; None when not asked.
        forward_passes: what it cost, in plain forward passes of one image.
        layout: the token layout ``tokens`` is in (``token_patches`` for the patches).
    """

    target: int
    label: str
    score_a: float
    score_b: float
    heads: torch.Tensor
    tokens: torch.Tensor | None
    forward_passes: float
    layout: TokenLayout

    @property
    def token_patches(self) -> torch.Tensor | None:
        """``tokens`` over the patch grid ``[layers, grid_h, grid_w]``."""
        return None if self.tokens is None else self.layout.patch_map(self.tokens)


def token_passes(layers: int, tokens: int) -> float:
    """Patching every token after every layer, in plain forward passes: per layer, the layers below it once and the
    layer itself and every layer above it once per token."""
    return sum(layer + tokens * (layers - layer) for layer in range(layers)) / layers


def patching_passes(layers: int, heads: int, num_tokens: int, tokens: bool) -> float:
    """What patching B into A costs (``methods.patching.patch``), in plain forward passes of one image: the two recording
    passes, then the branched ones (``forward_equivalents`` counts an ablation's original pass too, which patching does
    not run), and with ``tokens`` every token after every layer (``token_passes``)."""
    return 2 + forward_equivalents(layers, heads) - 1 + (token_passes(layers, num_tokens) if tokens else 0)
