"""Adapters for the Swin Transformers of timm (``SwinTransformer``, ``SwinTransformerV2``) and Hugging Face
(``Swin*``, ``Swinv2*``): window attention on stages whose grids halve from one to the next.

A Swin block's map is not one ``[heads, n, n]`` over a sequence shared by every layer, as a plain ViT's is: each stage
has its own grid (56 × 56 patches of 4 px at 224 px, then 28 × 28, 14 × 14, 7 × 7) and its own number of heads, and a
block attends within windows of that grid (``window_layout``). So this adapter does not implement ``CaptureAdapter``'s
``[layers, heads, n, n]`` contract; it hands each block's maps over by window ``[b, heads, windows, area, area]`` with
the block's ``WindowGeometry``, and ``core.stage_rollout`` reads them.

Each capture takes the softmax the block applies to its values: q·kᵀ·scale (V2: the scaled cosine) plus the
relative-position bias plus the shifted windows' mask. timm's blocks make it in ``attn.softmax`` on their explicit path
(``fused_attn`` off, restored on exit); Hugging Face's Swin in the attention function it calls (switched to transformers'
eager one with an edit, as ``hf_adapter`` does for ViT), and its Swin V2 passes it through ``attention.self.dropout``.
An edit of the maps (AttnLRP holds them constant) replaces them where they are caught.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import CaptureAdapter, keeping, layer_norms_of
from vit_explorer.models.hf_adapter import editing_attention, transformers_activations
from vit_explorer.models.layout import TokenLayout
from vit_explorer.models.timm_adapter import timm_activations
from vit_explorer.models.window_layout import WindowGeometry


class WindowAdapter(ABC):
    """What the stage methods read of a windowed ViT: its blocks in order, their stages and window geometry, and each
    block's softmax as it computes it."""

    @classmethod
    @abstractmethod
    def matches(cls, module: nn.Module) -> bool:
        """Whether this adapter understands ``module``."""

    @abstractmethod
    def stages(self, module: nn.Module) -> list[list[nn.Module]]:
        """Each stage's blocks, in the order the forward runs them."""

    @abstractmethod
    def first_grid(self, module: nn.Module) -> tuple[tuple[int, int], tuple[int, int]]:
        """(the first stage's grid, its patch in input pixels)."""

    @abstractmethod
    def block_window(self, block: nn.Module, grid_hw: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
        """(window, shift) of ``block`` on its stage's grid ``grid_hw``, as its forward uses them."""

    @abstractmethod
    def softmax_hooks(self, module: nn.Module, edit: Callable[[int, torch.Tensor], torch.Tensor | None]) -> ExitStack:
        """Hooks (and switches) that hand block i's softmax ``[b · windows, heads, area, area]`` to ``edit(i, maps)`` on
        each forward; a tensor it returns replaces the maps the block applies to its values. Closing the stack undoes
        them."""

    @abstractmethod
    def activations(self, module: nn.Module) -> list[nn.Module]:
        """Every element-wise non-linearity module (AttnLRP's identity rule)."""

    def layer_norms(self, module: nn.Module) -> list[nn.Module]:
        """Every LayerNorm (AttnLRP holds their scale constant), the patch mergings' too."""
        return layer_norms_of(module)

    @abstractmethod
    def logits(self, module: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels ``[b, 3, H, W]`` → logits ``[b, classes]`` (``[b, 0]`` for a backbone)."""

    @abstractmethod
    def input_hw(self, module: nn.Module) -> tuple[int, int]:
        """The input size the model was built for (its windows and masks are fixed by it)."""

    @abstractmethod
    def num_classes(self, module: nn.Module) -> int:
        """How many class scores ``module`` gives; 0 for a backbone."""

    @abstractmethod
    def block_stream(self, output: Any) -> torch.Tensor:
        """The stream after a block ``[b, H·W, C]`` (its stage's tokens row by row), from the block's forward output."""

    @abstractmethod
    def final_norm(self, module: nn.Module) -> nn.Module:
        """The norm the last stage's output goes through."""

    @abstractmethod
    def readout(self, module: nn.Module, stream: torch.Tensor) -> torch.Tensor:
        """The logits ``[b, classes]`` the model would give if ``stream`` ``[b, H·W, C]`` of its last stage were its
        last block's output: the final norm, the average pool and the head (what LeGrad reads each block through)."""

    def blocks(self, module: nn.Module) -> list[nn.Module]:
        """Every block of every stage, in the order the forward runs them."""
        return [block for stage in self.stages(module) for block in stage]

    def stage_of_blocks(self, module: nn.Module) -> list[int]:
        """The stage of each block (``blocks``' order)."""
        return [index for index, stage in enumerate(self.stages(module)) for _ in stage]

    @abstractmethod
    def heads(self, module: nn.Module) -> list[int]:
        """The heads of each block (``blocks``' order)."""

    def geometries(self, module: nn.Module) -> list[WindowGeometry]:
        """Each block's windows on its stage's grid (``blocks``' order): each patch merging halves the grid."""
        (rows, cols), (patch_h, patch_w) = self.first_grid(module)
        geometries = []
        for stage, blocks in enumerate(self.stages(module)):
            grid, scale = (rows >> stage, cols >> stage), 1 << stage
            for block in blocks:
                window, shift = self.block_window(block, grid)
                geometries.append(WindowGeometry(grid_hw=grid, window_hw=window, shift_hw=shift,
                                                 patch_hw=(patch_h * scale, patch_w * scale)))
        return geometries

    @contextmanager
    def attached(self, module: nn.Module,
                 sink: MutableMapping[int, torch.Tensor]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """While active, the yielded function maps pixels ``[b, 3, H, W]`` to logits ``[b, classes]`` and puts each
        block's softmax as the block computed it, ``[b · windows, heads, area, area]`` (``by_window`` reads it), in
        ``sink[block]``. The output itself is stored, so that its gradient can be taken."""
        def store(block: int, maps: torch.Tensor) -> None:
            sink[block] = maps

        with self.softmax_hooks(module, store):
            yield partial(self.logits, module)

    @contextmanager
    def constant_maps(self, module: nn.Module) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """While active, the yielded function maps pixels to logits with every block's maps out of the autograd graph:
        gradients reach the values only (AttnLRP's attention rule)."""
        with self.softmax_hooks(module, lambda _block, maps: maps.detach()):
            yield partial(self.logits, module)

    def by_window(self, captured: torch.Tensor, images: int) -> torch.Tensor:
        """A block's captured softmax ``[b · windows, heads, area, area]`` (images outermost, as both libraries cut them)
        → ``[b, heads, windows, area, area]``."""
        windows = captured.shape[0] // images
        return captured.reshape(images, windows, *captured.shape[1:]).transpose(1, 2)

    def check_input_hw(self, module: nn.Module, input_hw: tuple[int, int]) -> None:
        """Refuse an input the model was not built for."""
        built = self.input_hw(module)
        if tuple(input_hw) != built:
            raise VitExplorerError(f"this Swin takes {built[0]}×{built[1]} inputs, not {input_hw[0]}×{input_hw[1]}")


class TimmSwinAdapter(WindowAdapter):
    """timm's ``SwinTransformer`` and ``SwinTransformerV2``: each block's ``attn.softmax``."""

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        stages = getattr(module, "layers", None)
        return (
            type(module).__module__.startswith("timm.")
            and isinstance(stages, nn.Sequential) and len(stages) > 0
            and all(isinstance(getattr(getattr(block, "attn", None), "softmax", None), nn.Softmax)
                    and hasattr(block, "shift_size") and hasattr(block, "window_size")
                    for stage in stages for block in getattr(stage, "blocks", [None]))
        )

    def stages(self, module: nn.Module) -> list[list[nn.Module]]:
        return [list(stage.blocks) for stage in module.layers]

    def first_grid(self, module: nn.Module) -> tuple[tuple[int, int], tuple[int, int]]:
        return tuple(module.patch_embed.grid_size), tuple(module.patch_embed.patch_size)

    def heads(self, module: nn.Module) -> list[int]:
        return [block.attn.num_heads for block in self.blocks(module)]

    def block_window(self, block: nn.Module, grid_hw: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
        return tuple(block.window_size), tuple(block.shift_size)  # timm sets both for the grid it was built for

    def softmax_hooks(self, module: nn.Module, edit: Callable[[int, torch.Tensor], torch.Tensor | None]) -> ExitStack:
        stack = ExitStack()
        for index, block in enumerate(self.blocks(module)):
            attention = block.attn
            if hasattr(attention, "fused_attn"):  # V1 has a fused path, V2 only the explicit one
                stack.callback(setattr, attention, "fused_attn", attention.fused_attn)
                attention.fused_attn = False
            stack.callback(attention.softmax.register_forward_hook(
                lambda _module, _inputs, output, index=index: edit(index, output)).remove)
        return stack

    def activations(self, module: nn.Module) -> list[nn.Module]:
        return timm_activations(module)

    def logits(self, module: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        output = module(pixels)
        return output if module.num_classes else output.new_zeros(output.shape[0], 0)

    def input_hw(self, module: nn.Module) -> tuple[int, int]:
        return tuple(module.patch_embed.img_size)

    def num_classes(self, module: nn.Module) -> int:
        return int(module.num_classes)

    def block_stream(self, output: torch.Tensor) -> torch.Tensor:
        return output.flatten(1, 2)  # timm's blocks keep the grid: [b, H, W, C]

    def final_norm(self, module: nn.Module) -> nn.Module:
        return module.norm

    def readout(self, module: nn.Module, stream: torch.Tensor) -> torch.Tensor:
        side = self.geometries(module)[-1].grid_hw
        return module.forward_head(module.norm(stream.unflatten(1, side)))


class HFSwinAdapter(WindowAdapter):
    """Hugging Face's Swin and Swin V2 (a bare model or one with a classifier)."""

    @staticmethod
    def backbone(module: nn.Module) -> nn.Module | None:
        return getattr(module, "swin", None) or getattr(module, "swinv2", None) or module

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        backbone = cls.backbone(module)
        return (type(module).__module__.startswith("transformers.")
                and getattr(getattr(module, "config", None), "model_type", None) in ("swin", "swinv2")
                and hasattr(getattr(backbone, "encoder", None), "layers"))

    def stages(self, module: nn.Module) -> list[list[nn.Module]]:
        return [list(stage.blocks) for stage in self.backbone(module).encoder.layers]

    def first_grid(self, module: nn.Module) -> tuple[tuple[int, int], tuple[int, int]]:
        patch = module.config.patch_size
        patch_hw = (patch, patch) if isinstance(patch, int) else tuple(patch)
        return tuple(self.backbone(module).embeddings.patch_grid), patch_hw

    def heads(self, module: nn.Module) -> list[int]:
        return [heads for heads, stage in zip(module.config.num_heads, self.stages(module), strict=True) for _ in stage]

    def block_window(self, block: nn.Module, grid_hw: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
        # the layer's own clamp (``set_shift_and_window_size``): a grid no larger than the window is one window, unshifted
        window = min(block.window_size, *grid_hw) if min(grid_hw) <= block.window_size else block.window_size
        shift = 0 if min(grid_hw) <= block.window_size else int(block.shift_size)
        return (int(window), int(window)), (shift, shift)

    def softmax_hooks(self, module: nn.Module, edit: Callable[[int, torch.Tensor], torch.Tensor | None]) -> ExitStack:
        stack = ExitStack()
        if module.config.model_type == "swinv2":  # its own softmax, then ``attention.self.dropout``
            for index, block in enumerate(self.blocks(module)):
                stack.callback(block.attention.self.dropout.register_forward_hook(
                    lambda _module, _inputs, output, index=index: edit(index, output)).remove)
            return stack
        # Swin calls an attention function: transformers' eager one, with the edit of each attention module (``hf_adapter``)
        stack.enter_context(editing_attention(module, {block.attention: partial(replaced, edit, index)
                                                       for index, block in enumerate(self.blocks(module))}))
        return stack

    def activations(self, module: nn.Module) -> list[nn.Module]:
        return transformers_activations(module)

    def logits(self, module: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        logits = getattr(module(pixel_values=pixels), "logits", None)
        return logits if logits is not None else pixels.new_zeros(pixels.shape[0], 0)

    def input_hw(self, module: nn.Module) -> tuple[int, int]:
        size = module.config.image_size
        return (size, size) if isinstance(size, int) else tuple(size)

    def num_classes(self, module: nn.Module) -> int:
        return int(module.config.num_labels) if getattr(module, "classifier", None) is not None else 0

    def block_stream(self, output: tuple) -> torch.Tensor:
        return output[0]

    def final_norm(self, module: nn.Module) -> nn.Module:
        return self.backbone(module).layernorm

    def readout(self, module: nn.Module, stream: torch.Tensor) -> torch.Tensor:
        classifier = getattr(module, "classifier", None)
        if classifier is None:
            return stream.new_zeros(stream.shape[0], 0)
        # ``SwinModel``: the final layer norm, then the average pool over the tokens; the classifier on top
        return classifier(self.backbone(module).layernorm(stream).mean(dim=1))


def replaced(edit: Callable[[int, torch.Tensor], torch.Tensor | None], index: int, maps: torch.Tensor) -> torch.Tensor:
    """Block ``index``'s maps after ``edit``: what it returns, or the maps themselves where it returns None."""
    result = edit(index, maps)
    return maps if result is None else result


WINDOW_ADAPTERS: tuple[type[WindowAdapter], ...] = (TimmSwinAdapter, HFSwinAdapter)


def window_adapter_for(module: nn.Module) -> WindowAdapter:
    """The window adapter of ``module``'s family."""
    for adapter in WINDOW_ADAPTERS:
        if adapter.matches(module):
            return adapter()
    raise VitExplorerError(f"{type(module).__name__} is not a Swin that vit_explorer reads: it reads timm's and Hugging "
                           "Face's Swin and Swin V2")


class StageAdapter(CaptureAdapter):
    """One stage of a windowed ViT, read as a plain ViT without prefix tokens: the stage's blocks are the layers, its
    grid the tokens, and each block's map the dense ``[b, heads, n, n]`` its windows make on that grid (zero between
    tokens of different windows), placed from the window maps as they are caught and taken apart again after any edit,
    so that every view, statistic and edit of a plain ViT reads a stage. A map's gradient flows through the placement.

    What needs the model's read-out (the final norm, average pool and head: LeGrad's per-layer read-out, a backbone's
    embedding) takes the last stage's width only; an earlier stage's tokens are standardised for the token views instead
    (``final_tokens``). The methods that chain across stages are ``core.stage_rollout``'s and ``core.stage_attribution``'s.
    """

    def __init__(self, windows: WindowAdapter | None = None, stage: int = 0) -> None:
        self.windows = windows
        self.stage = stage

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        return any(kind.matches(module) for kind in WINDOW_ADAPTERS)

    def window_adapter(self, module: nn.Module) -> WindowAdapter:
        if self.windows is None:
            self.windows = window_adapter_for(module)
        return self.windows

    def stage_blocks(self, module: nn.Module) -> list[int]:
        """The indices (among every block) of this stage's blocks."""
        stages = self.window_adapter(module).stage_of_blocks(module)
        if not 0 <= self.stage <= stages[-1]:
            raise VitExplorerError(f"stage {self.stage} is outside this Swin's stages 0…{stages[-1]}")
        return [block for block, stage in enumerate(stages) if stage == self.stage]

    def geometry(self, module: nn.Module) -> WindowGeometry:
        """The stage's grid, as its first block cuts it (its blocks differ in their shift only)."""
        return self.window_adapter(module).geometries(module)[self.stage_blocks(module)[0]]

    def num_stages(self, module: nn.Module) -> int:
        return self.window_adapter(module).stage_of_blocks(module)[-1] + 1

    def at_stage(self, module: nn.Module, stage: int) -> StageAdapter:
        if not 0 <= stage < self.num_stages(module):
            raise VitExplorerError(f"stage {stage} is outside this Swin's stages 0…{self.num_stages(module) - 1}")
        return StageAdapter(self.window_adapter(module), stage)

    def is_last_stage(self, module: nn.Module) -> bool:
        return self.stage == self.window_adapter(module).stage_of_blocks(module)[-1]

    def family_notes(self, module: nn.Module) -> list[str]:
        windows = self.window_adapter(module)
        geometry, stages = self.geometry(module), windows.stage_of_blocks(module)
        blocks = self.stage_blocks(module)
        return [f"Swin, stage {self.stage} of stages 0…{stages[-1]}: blocks {blocks[0]}…{blocks[-1]} on a "
                f"{geometry.grid_hw[0]}×{geometry.grid_hw[1]} grid of {geometry.patch_hw[0]} px patches, each attending "
                f"within {geometry.window_hw[0]}×{geometry.window_hw[1]} windows (every other block's shifted by "
                f"{max(g.shift_hw[0] for g in windows.geometries(module)[blocks[0]:blocks[-1] + 1])}); the class maps "
                "chain every stage"]

    def recorded_inputs(self, module: nn.Module, record: Callable) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        raise VitExplorerError("a Swin block attends within windows, with a relative-position bias and the shifted "
                               "windows' mask: its map over the stage is not a softmax of its queries against every key, "
                               "so it is captured whole")

    def layout(self, module: nn.Module, input_hw: tuple[int, int]) -> TokenLayout:
        self.window_adapter(module).check_input_hw(module, input_hw)
        geometry = self.geometry(module)
        return TokenLayout(prefix_names=(), grid_hw=geometry.grid_hw, patch_hw=geometry.patch_hw)

    def map_shape(self, module: nn.Module) -> tuple[int, int]:
        blocks = self.stage_blocks(module)
        return len(blocks), self.window_adapter(module).heads(module)[blocks[0]]

    def num_classes(self, module: nn.Module) -> int:
        return self.window_adapter(module).num_classes(module)

    def blocks(self, module: nn.Module) -> list[nn.Module]:
        every = self.window_adapter(module).blocks(module)
        return [every[block] for block in self.stage_blocks(module)]

    def residual_after(self, inputs: tuple, output: Any) -> torch.Tensor:
        return self.windows.block_stream(output)

    def logits(self, module: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        return self.window_adapter(module).logits(module, pixels)

    @contextmanager
    def edited(self, module: nn.Module,
               edits: Mapping[int, Callable[[torch.Tensor], torch.Tensor]]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        windows = self.window_adapter(module)
        layer_of = {block: layer for layer, block in enumerate(self.stage_blocks(module))}
        geometries = windows.geometries(module)
        orders = {layer: geometries[block].placement()[0] for block, layer in layer_of.items()}  # [windows, area] each
        height, width = self.geometry(module).grid_hw
        n = height * width

        def edit(block: int, maps: torch.Tensor) -> torch.Tensor | None:
            layer = layer_of.get(block)
            if layer not in edits:
                return None
            order = orders[layer].to(maps.device)
            pairs = (order[:, :, None] * n + order[:, None, :]).flatten()  # [windows · area · area] in the dense map
            images = maps.shape[0] // order.shape[0]
            by_window = windows.by_window(maps, images)  # [b, heads, windows, area, area]
            dense = by_window.new_zeros(*by_window.shape[:2], n * n).index_copy(-1, pairs, by_window.flatten(2))
            edited = edits[layer](dense.view(*by_window.shape[:2], n, n))  # [b, heads, n, n]
            back = edited.flatten(2)[..., pairs].view(by_window.shape)
            return back.transpose(1, 2).reshape(maps.shape)

        with windows.softmax_hooks(module, edit):
            yield partial(self.logits, module)

    @contextmanager
    def attached(self, module: nn.Module,
                 sink: MutableMapping[int, torch.Tensor]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        with self.edited(module, keeping(sink, self.map_shape(module)[0])) as forward:
            yield forward

    def attention_writes(self, module: nn.Module) -> list[nn.Module]:
        raise VitExplorerError("a Swin block joins its windows' outputs and undoes the shift inside the block, so no module "
                               "outputs what its attention adds to the stream, and its last stage's stream is not the "
                               "earlier stages' (patch merging): its prediction is not split over heads")

    def head_projections(self, module: nn.Module) -> list[nn.Module]:
        raise VitExplorerError("a Swin block's heads meet window by window inside the block: one head's output cannot be "
                               "patched from another image there")

    def readout_only(self, module: nn.Module, what: str) -> None:
        if not self.is_last_stage(module):
            raise VitExplorerError(f"{what} reads a block's stream through Swin's final norm and head, whose width only the "
                                   f"last stage has: choose stage {self.window_adapter(module).stage_of_blocks(module)[-1]}")

    def classify(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        self.readout_only(module, "this view")
        return self.window_adapter(module).readout(module, hidden)

    def final_tokens(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        if self.is_last_stage(module):
            return self.window_adapter(module).final_norm(module)(hidden)
        return F.layer_norm(hidden, hidden.shape[-1:])  # no final norm takes this width: each token standardised

    def pool(self, module: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        self.readout_only(module, "an image's embedding")
        return tokens.mean(dim=1)  # Swin's average pool

    def layer_norms(self, module: nn.Module) -> list[nn.Module]:
        return self.window_adapter(module).layer_norms(module)

    def activations(self, module: nn.Module) -> list[nn.Module]:
        return self.window_adapter(module).activations(module)
