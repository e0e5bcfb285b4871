"""LeGrad and AttnLRP on a windowed ViT (Swin): the two class-specific methods that take passes of the model of their own.

- **LeGrad** (Bousselham et al.): each block's own read-out of the class, differentiated by that block's maps, clipped at
  zero and averaged over heads and queries, then over the blocks. Swin's read-out (final norm, average pool, head) takes
  the width of its last stage only, so the blocks read are the last stage's among the last ``legrad.LAST_LAYERS`` (the
  authors' default), and the map is on that stage's grid (7 × 7 at 224 px), each value covering its block of first-stage
  patches.
- **AttnLRP** (Achtibat et al.): the rules ``core.attnlrp`` applies to a plain ViT carry over unchanged, since a window's
  softmax is a softmax attention and a patch merging is a LayerNorm and a linear map: every window map held constant,
  every LayerNorm's scale constant, the identity rule through the activations, gradient × input at the pixels, summed
  over each first-stage patch.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from vit_explorer.core.attnlrp import lrp_rules
from vit_explorer.core.capture import capture_lock
from vit_explorer.core.legrad import LAST_LAYERS
from vit_explorer.core.stage_rollout import check_one_image
from vit_explorer.models.swin_adapter import WindowAdapter


def legrad_blocks(adapter: WindowAdapter, module: nn.Module) -> list[int]:
    """The blocks LeGrad reads: the last ``LAST_LAYERS`` blocks that are in the last stage (whose width the read-out
    takes)."""
    stages = adapter.stage_of_blocks(module)
    return [block for block in range(len(stages))[-LAST_LAYERS:] if stages[block] == stages[-1]]


def stage_legrad(module: nn.Module, adapter: WindowAdapter, pixels: torch.Tensor, target: int) -> torch.Tensor:
    """The LeGrad map of class ``target`` for one image ``pixels`` ``[1, 3, H, W]`` on the first stage's grid
    ``[H₀, W₀]`` (float32, non-negative; constant over each last-stage token's block of patches)."""
    check_one_image(pixels)
    geometries = adapter.geometries(module)
    blocks = legrad_blocks(adapter, module)
    streams: dict[int, torch.Tensor] = {}
    maps: dict[int, torch.Tensor] = {}

    def keep_stream(block: int, _module: nn.Module, _inputs: tuple, output) -> None:
        streams[block] = adapter.block_stream(output)

    all_blocks = adapter.blocks(module)
    handles = [all_blocks[block].register_forward_hook(partial(keep_stream, block)) for block in blocks]
    try:
        with capture_lock(module), torch.enable_grad(), adapter.attached(module, maps) as forward:
            forward(pixels.detach().requires_grad_(True))
            per_block = []
            for block in blocks:
                score = adapter.readout(module, streams[block])[0, target]
                (gradient,) = torch.autograd.grad(score, maps[block], retain_graph=True)  # [windows, heads, area, area]
                geometry = geometries[block]
                # over heads, then over every query of the stage (a key's own window's queries; the rest give it 0)
                by_key = gradient.float().clamp_min(0.0).mean(dim=1).sum(dim=1) / (geometry.num_windows * geometry.window_area)
                per_block.append(geometry.from_windows(by_key))  # [H, W]
    finally:
        for handle in handles:
            handle.remove()
    last = torch.stack(per_block).mean(dim=0).detach()
    first = geometries[0].grid_hw
    return last.repeat_interleave(first[0] // last.shape[0], dim=0).repeat_interleave(first[1] // last.shape[1], dim=1).cpu()


def stage_attnlrp(module: nn.Module, adapter: WindowAdapter, pixels: torch.Tensor, target: int) -> torch.Tensor:
    """The AttnLRP map of class ``target`` for one image ``pixels`` ``[1, 3, H, W]`` on the first stage's grid
    ``[H₀, W₀]`` (float32, signed)."""
    check_one_image(pixels)
    with capture_lock(module), torch.enable_grad(), lrp_rules(module, adapter), adapter.constant_maps(module) as forward:
        inputs = pixels.detach().requires_grad_(True)
        score = forward(inputs)[0, target]
        (gradient,) = torch.autograd.grad(score, inputs)
    per_pixel = (inputs * gradient).detach()[0].sum(dim=0)  # [H, W]
    patch_h, patch_w = adapter.geometries(module)[0].patch_hw
    return (F.avg_pool2d(per_pixel[None, None].float(), (patch_h, patch_w)) * (patch_h * patch_w))[0, 0].cpu()
