"""Adapter for timm's Swin Transformers (``SwinTransformer`` and ``SwinTransformerV2``): window attention on stages whose
grids halve from one to the next.

A Swin block's map is not one ``[heads, n, n]`` over a sequence shared by every layer, as a plain ViT's is: each stage
has its own grid (56 × 56 patches of 4 px at 224 px, then 28 × 28, 14 × 14, 7 × 7) and its own number of heads, and a
block attends within windows of that grid (``window_layout``). So this adapter does not implement ``CaptureAdapter``'s
``[layers, heads, n, n]`` contract; it hands each block's maps over by window ``[b, heads, windows, area, area]`` with
the block's ``WindowGeometry``, and ``core.stage_rollout`` reads them.

The capture hooks each block's ``attn.softmax`` on timm's explicit path (``fused_attn`` off, restored on exit): its
output is the softmax of q·kᵀ·scale (V2: the scaled cosine) plus the relative-position bias plus the shifted windows'
mask, exactly the weights the block applies to its values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from contextlib import ExitStack, contextmanager
from functools import partial

import torch
from torch import nn

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.window_layout import WindowGeometry


class SwinAdapter:
    """timm's Swin and Swin V2: the blocks of every stage in order, their window geometry, and their softmax."""

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        """A timm Swin: stages (``layers``) of blocks whose attention runs through an ``nn.Softmax`` module, on a grid
        with a window size and a shift."""
        stages = getattr(module, "layers", None)
        return (
            type(module).__module__.startswith("timm.")
            and isinstance(stages, nn.Sequential) and len(stages) > 0
            and all(isinstance(getattr(getattr(block, "attn", None), "softmax", None), nn.Softmax)
                    and hasattr(block, "shift_size") and hasattr(block, "input_resolution")
                    for stage in stages for block in getattr(stage, "blocks", [None]))
        )

    def blocks(self, module: nn.Module) -> list[nn.Module]:
        """Every block of every stage, in the order the forward runs them."""
        return [block for stage in module.layers for block in stage.blocks]

    def stage_of_blocks(self, module: nn.Module) -> list[int]:
        """The stage of each block (``blocks``' order)."""
        return [stage for stage, layer in enumerate(module.layers) for _ in layer.blocks]

    def heads(self, module: nn.Module) -> list[int]:
        """The heads of each block."""
        return [block.attn.num_heads for block in self.blocks(module)]

    def geometries(self, module: nn.Module) -> list[WindowGeometry]:
        """Each block's windows on its stage's grid (``blocks``' order)."""
        first = tuple(module.patch_embed.grid_size)
        patch = tuple(module.patch_embed.patch_size)
        geometries = []
        for block in self.blocks(module):
            grid = tuple(block.input_resolution)
            scale = (first[0] // grid[0], first[1] // grid[1])
            geometries.append(WindowGeometry(grid_hw=grid, window_hw=tuple(block.window_size),
                                             shift_hw=tuple(block.shift_size),
                                             patch_hw=(patch[0] * scale[0], patch[1] * scale[1])))
        return geometries

    @contextmanager
    def attached(self, module: nn.Module,
                 sink: MutableMapping[int, torch.Tensor]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """While active, the yielded function maps pixels ``[b, 3, H, W]`` to logits ``[b, classes]`` and puts each
        block's softmax as the block computed it, ``[b · windows, heads, area, area]`` (``by_window`` reads it), in
        ``sink[block]``. The output itself is stored, so that its gradient can be taken."""

        def store(block: int, _module: nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
            sink[block] = output

        attentions = [block.attn for block in self.blocks(module)]
        with ExitStack() as stack:
            for attention in attentions:
                if hasattr(attention, "fused_attn"):  # V1 has a fused path, V2 only the explicit one
                    stack.callback(setattr, attention, "fused_attn", attention.fused_attn)
                    attention.fused_attn = False
            for index, attention in enumerate(attentions):
                stack.callback(attention.softmax.register_forward_hook(partial(store, index)).remove)
            yield partial(self.logits, module)

    def logits(self, module: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        output = module(pixels)
        return output if module.num_classes else output.new_zeros(output.shape[0], 0)

    def by_window(self, captured: torch.Tensor, images: int) -> torch.Tensor:
        """A block's captured softmax ``[b · windows, heads, area, area]`` (images outermost, as timm cuts them) →
        ``[b, heads, windows, area, area]``."""
        windows = captured.shape[0] // images
        return captured.reshape(images, windows, *captured.shape[1:]).transpose(1, 2)

    def check_input_hw(self, module: nn.Module, input_hw: tuple[int, int]) -> None:
        """Refuse an input the model was not built for (its masks and windows are fixed at build time)."""
        built = tuple(module.patch_embed.img_size)
        if tuple(input_hw) != built:
            raise VitExplorerError(f"this Swin takes {built[0]}×{built[1]} inputs, not {input_hw[0]}×{input_hw[1]}")
