"""AttnLRP (Achtibat et al., ICML 2024) as LXT computes it for vision transformers: relevance as gradient × input
through a forward pass whose backward obeys the LRP rules.

The rules, each a change to the backward pass only (the forward values are the model's own):

- attention (CP-LRP): no relevance flows through queries and keys: the post-softmax map is a constant, so relevance
  reaches the values only;
- LayerNorm: the standard deviation is a constant (the identity rule through the normalisation); so is the length
  a CLIP-like model divides its embedding by before the cosine;
- element-wise activations (GELU, ...): the identity rule, ∂out/∂in replaced by out / in;
- everything linear (projections, residual sums, the head) propagates by the gradient, which with × input is LRP-0.

The relevance of the target logit is read at the input as gradient × input summed over colour channels and over each
patch's pixels: for the linear patch embedding that equals the patch embedding's gradient × (output − bias).
One forward and one backward pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from vit_explorer.core.capture import capture_lock, resolve
from vit_explorer.models.base import CaptureAdapter, LoadedModel
from vit_explorer.models.swin_adapter import WindowAdapter

EPSILON = 1e-10  # LXT's stabiliser of out / in in the identity rule


class IdentityRule(torch.autograd.Function):
    """Passes ``output`` on; its backward hands ``inputs`` the gradient times output / input (the identity rule)."""

    @staticmethod
    def forward(ctx, inputs: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(output / (inputs + EPSILON))
        return output.view_as(output)

    @staticmethod
    def backward(ctx, gradient: torch.Tensor) -> tuple[torch.Tensor, None]:
        (ratio,) = ctx.saved_tensors
        return gradient * ratio, None


def constant_scale_norm(norm: nn.Module, inputs: tuple, _output: torch.Tensor) -> torch.Tensor:
    """A LayerNorm's output recomputed with its standard deviation out of the graph (a norm of another kind, such as a
    cosine's ``UnitNorm``, holds its own scale through ``held``)."""
    x = inputs[0]
    if hasattr(norm, "held"):
        return norm.held(x)
    centred = x - x.mean(dim=-1, keepdim=True)
    scale = (centred.pow(2).mean(dim=-1, keepdim=True) + norm.eps).sqrt().detach()
    result = centred / scale
    if norm.weight is not None:
        result = result * norm.weight
    if norm.bias is not None:
        result = result + norm.bias
    return result


def identity_rule(_activation: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    return IdentityRule.apply(inputs[0], output.detach())


@contextmanager
def lrp_rules(module: nn.Module, adapter: CaptureAdapter | WindowAdapter) -> Iterator[None]:
    """While active, ``module``'s LayerNorms and activations follow the rules above in the backward pass."""
    handles = [norm.register_forward_hook(constant_scale_norm) for norm in adapter.layer_norms(module)]
    handles += [activation.register_forward_hook(identity_rule) for activation in adapter.activations(module)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def input_relevance(model: LoadedModel, pixels: torch.Tensor, target: int) -> torch.Tensor:
    """AttnLRP relevance of class ``target``'s logit at every input value ``[b, 3, H, W]`` (gradient × input)."""
    module, adapter = resolve(model)
    num_layers = model.map_shape[0]
    constant = dict.fromkeys(range(num_layers), torch.Tensor.detach)
    with (capture_lock(module), torch.enable_grad(), lrp_rules(module, adapter),
          adapter.edited(module, constant) as forward):
        inputs = pixels.detach().requires_grad_(True)
        score = forward(inputs)[:, target].sum()
        (gradient,) = torch.autograd.grad(score, inputs)
    return (inputs * gradient).detach()


def attnlrp(model: LoadedModel, pixels: torch.Tensor, target: int) -> torch.Tensor:
    """The AttnLRP map of class ``target`` for one image ``pixels`` ``[1, 3, H, W]`` over the patch grid ``[grid_h, grid_w]``
    (float32, CPU, signed: negative relevance speaks against the class)."""
    per_pixel = input_relevance(model, pixels, target)[0].sum(dim=0)  # [H, W]
    patch_h, patch_w = model.layout.patch_hw
    per_patch = F.avg_pool2d(per_pixel[None, None].float(), (patch_h, patch_w)) * (patch_h * patch_w)
    return per_patch[0, 0].cpu()
