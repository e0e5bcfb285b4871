"""Class-specific maps from attention and its gradient: gradient-weighted rollout and the generic
relevance of Chefer, Gur & Wolf (ICCV 2021), and the gradient importance of each head.

Pure tensor math on ``[layers, heads, n, n]`` attentions and their gradients ∂ score / ∂ A for one
class (``capture.capture`` with a target). Both maps start from the same per-layer matrix
Ē_l = mean over heads of (∇A_l ⊙ A_l)⁺ and differ in how they chain the layers:

- gradient-weighted rollout mixes Ē_l with the identity and normalises rows, as rollout does with A_l;
- relevance keeps R_0 = I and updates R_l = R_{l−1} + Ē_l · R_{l−1}, i.e. R = ∏ (I + Ē_l), unnormalised.

Each chain is a product of per-layer factors, so one query row costs O(layers·n²) with
``rollout.rollout_rows``, exactly as for plain rollout.
"""

from __future__ import annotations

import torch

from vit_explorer.core.rollout import as_attention_stack, rollout_factors
from vit_explorer.errors import VitExplorerError


def weighted_attention(attentions: torch.Tensor, gradients: torch.Tensor) -> torch.Tensor:
    """Ē = mean over heads of (∇A ⊙ A)⁺ ``[layers, n, n]``: attention where raising it raises the class score."""
    stack, grads = as_attention_stack(attentions), as_attention_stack(gradients)
    if stack.shape != grads.shape:
        raise VitExplorerError(f"attentions {tuple(stack.shape)} and gradients {tuple(grads.shape)} differ in shape")
    return (grads * stack).clamp_min(0.0).mean(dim=1)


def relevance_factors(weighted: torch.Tensor) -> torch.Tensor:
    """The per-layer factors I + Ē_l ``[layers, n, n]`` whose product is the relevance R."""
    return weighted + torch.eye(weighted.shape[-1], dtype=weighted.dtype)


def relevance(attentions: torch.Tensor, gradients: torch.Tensor) -> torch.Tensor:
    """The full relevance matrix R ``[n, n]`` (row i: what token i's output owes to each input token)."""
    factors = relevance_factors(weighted_attention(attentions, gradients))
    result = torch.eye(factors.shape[-1], dtype=factors.dtype)
    for factor in factors:
        result = factor @ result
    return result


def grad_rollout_factors(
    weighted: torch.Tensor, discard_ratio: float = 0.0, residual_weight: float = 0.5, num_protected: int = 1
) -> torch.Tensor:
    """Rollout factors ``[layers, n, n]`` of the gradient-weighted maps Ē (already fused over heads).

    A layer whose Ē is all zero (no attention raises the score) leaves only the residual path.
    """
    return rollout_factors(weighted[:, None], "mean", discard_ratio, residual_weight, num_protected)


def layer_evidence(attention: torch.Tensor, gradient: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's share of both: (∇A ⊙ A)⁺ averaged over heads ``[b, n, n]`` and Σ |∇A ⊙ A| per head
    ``[b, heads]``, from a layer's maps and gradients ``[b, heads, n, n]`` (float32, on the CPU), so that
    capture can reduce each layer's gradient as it comes instead of keeping them all."""
    product = gradient.float() * attention.float()
    return product.clamp_min(0.0).mean(dim=1).cpu(), product.abs().sum(dim=(-2, -1)).cpu()
