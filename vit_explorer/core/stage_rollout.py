"""Rollout, gradient-weighted rollout and relevance across the stages of a windowed ViT (Swin).

Each block's attention is a block-diagonal matrix over its stage's tokens: one ``[area, area]`` block per window
(``models.window_layout``), so that its factor is applied to a row of weights window by window, never as an n × n
matrix. The chain runs from what the model reads out down to the first stage's grid:

- the read-out is Swin's average pool: every token of the last stage weighs 1 / n;
- a block's factor is rollout's rownorm((1 − w)·Ā + w·I) (``rollout.mixed_rows``, window by window), with Ā the mean
  of its heads' maps (Abnar & Zuidema), or
  for the class-specific maps the same of Ē = mean over heads of (∇A ⊙ A)⁺ (gradient-weighted rollout), or
  I + Ē (Chefer et al.'s relevance, unnormalised), as ``core.relevance`` chains a plain ViT's layers;
- a patch merging makes each token of the next stage from a 2 × 2 block of this stage's tokens by one linear map of
  their concatenated channels; the chain gives each of the four an equal share of the merged token's weight. This is
  the assumption (as rollout's own, that attention alone moves information between tokens): the merge's weights
  are not read.

The result is a map over the first stage's grid (56 × 56 patches of 4 px for a Swin at 224 px).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vit_explorer.core.capture import TOP, capture_lock
from vit_explorer.core.relevance import relevance_factors
from vit_explorer.core.rollout import fused_rows, mixed_rows
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.swin_adapter import WindowAdapter
from vit_explorer.models.window_layout import WindowGeometry

STAGE_METHODS = ("rollout", "grad-rollout", "relevance")


@dataclass(frozen=True)
class WindowedAttention:
    """One image's attention in every block of a windowed ViT.

    Attributes:
        maps: per block ``[heads, windows, area, area]``, each row a distribution over its window's keys.
        geometries: per block, its windows on its stage's grid.
        stages: per block, its stage.
        logits: the model's output ``[classes]``.
        gradients: per block ∂ logits[target] / ∂ maps, the maps' shapes; None where no target was asked for.
        target: the class the gradients are of, or None.
    """

    maps: list[torch.Tensor]
    geometries: list[WindowGeometry]
    stages: list[int]
    logits: torch.Tensor
    gradients: list[torch.Tensor] | None = None
    target: int | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the maps and gradients held."""
        return sum(maps.nbytes for maps in self.maps) + sum(grad.nbytes for grad in self.gradients or [])


def check_one_image(pixels: torch.Tensor) -> None:
    if pixels.ndim != 4 or pixels.shape[0] != 1:
        raise VitExplorerError(f"expected one image, pixels [1, 3, H, W], not {list(pixels.shape)}")


def capture_windows(module: nn.Module, adapter: WindowAdapter, pixels: torch.Tensor,
                    target: int | str | None = None) -> WindowedAttention:
    """One forward pass of one image ``pixels`` ``[1, 3, H, W]`` with every block's window maps, and with ``target`` (a
    class, or ``capture.TOP``: the top one) one backward pass from that class's logit to them."""
    check_one_image(pixels)
    adapter.check_input_hw(module, tuple(pixels.shape[-2:]))
    captured: dict[int, torch.Tensor] = {}
    with (capture_lock(module), torch.set_grad_enabled(target is not None),
          adapter.attached(module, captured) as forward):
        logits = forward(pixels.detach().requires_grad_(target is not None))
    blocks = adapter.blocks(module)
    if sorted(captured) != list(range(len(blocks))):
        raise RuntimeError(f"captured {len(captured)} of {len(blocks)} Swin blocks' maps")
    raw = [captured[block] for block in range(len(blocks))]
    gradients = None
    if target == TOP:
        target = int(logits[0].argmax()) if logits.shape[-1] else None
    if target is not None:
        if not 0 <= target < logits.shape[-1]:
            raise VitExplorerError(f"class {target} is outside this model's {logits.shape[-1]} classes")
        grads = torch.autograd.grad(logits[0, target], raw)
        gradients = [adapter.by_window(grad.detach(), 1)[0].float() for grad in grads]
    return WindowedAttention(maps=[adapter.by_window(maps.detach(), 1)[0].float() for maps in raw],
                             geometries=adapter.geometries(module), stages=adapter.stage_of_blocks(module),
                             logits=logits[0].detach().float(), gradients=gradients, target=target)


def through_block(weights: torch.Tensor, factor: torch.Tensor, geometry: WindowGeometry) -> torch.Tensor:
    """A row of weights on the block's output tokens ``[H, W]`` times its factor ``[windows, area, area]``: the weights
    on its input tokens ``[H, W]``."""
    by_window = geometry.to_windows(weights)  # [windows, area]
    return geometry.from_windows(torch.einsum("wi,wij->wj", by_window, factor))


def through_merge(weights: torch.Tensor, finer_hw: tuple[int, int]) -> torch.Tensor:
    """A row of weights on a merged stage's grid ``[H, W]`` → on the grid before the merge ``[2H, 2W]``: each merged
    token's weight shared equally by the 2 × 2 tokens it was made of."""
    if tuple(finer_hw) != (2 * weights.shape[0], 2 * weights.shape[1]):
        raise VitExplorerError(f"a {finer_hw[0]}×{finer_hw[1]} grid is not merged into the next stage's "
                               f"{weights.shape[0]}×{weights.shape[1]} by 2 × 2 blocks")
    return weights.repeat_interleave(2, dim=0).repeat_interleave(2, dim=1) / 4.0


def block_factors(windowed: WindowedAttention, method: str, residual_weight: float = 0.5,
                  head_fusion: str = "mean") -> list[torch.Tensor]:
    """Each block's factor for ``method`` (``STAGE_METHODS``) ``[windows, area, area]``; rollout fuses the heads by
    ``head_fusion`` (``rollout.HEAD_FUSIONS``), the gradient-weighted chains by the mean, as for a plain ViT."""
    if method not in STAGE_METHODS:
        raise VitExplorerError(f"unknown stage method {method!r}; use one of {', '.join(STAGE_METHODS)}")
    if method == "rollout":
        return [mixed_rows(fused_rows(maps, head_fusion), residual_weight=residual_weight, num_protected=0)
                for maps in windowed.maps]
    if windowed.gradients is None:
        raise VitExplorerError(f"{method} explains a class: capture the maps with a target")
    weighted = [(grad * maps).clamp_min(0.0).mean(dim=0) for maps, grad in zip(windowed.maps, windowed.gradients, strict=True)]
    if method == "grad-rollout":
        return [mixed_rows(mean, residual_weight=residual_weight, num_protected=0) for mean in weighted]
    return [relevance_factors(mean) for mean in weighted]


def stage_map(windowed: WindowedAttention, method: str = "rollout", residual_weight: float = 0.5,
              head_fusion: str = "mean") -> torch.Tensor:
    """What the average pool draws on, chained through every block and merge down to the first stage's grid
    ``[H₀, W₀]`` (float64, non-negative) for ``method`` (``STAGE_METHODS``)."""
    factors = block_factors(windowed, method, residual_weight, head_fusion)
    last = windowed.geometries[-1].grid_hw
    weights = torch.full(last, 1.0 / (last[0] * last[1]), dtype=torch.float64)
    for factor, geometry in zip(reversed(factors), reversed(windowed.geometries), strict=True):
        if tuple(weights.shape) != geometry.grid_hw:
            weights = through_merge(weights, geometry.grid_hw)
        weights = through_block(weights, factor.double(), geometry)
    return weights
