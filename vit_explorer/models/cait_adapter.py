"""Adapter for timm's CaiT (Touvron et al., 2021): self-attention over the patches alone, then class attention.

CaiT runs its patches through self-attention layers with no class token (``blocks``), and only then adds the class token,
which attends to itself and the patches in a few class-attention layers (``blocks_token_only``) while the patches pass
through unchanged. Both kinds are laid on one token sequence, the class token first and then the patches, so that every
layer's map is ``[b, heads, n, n]`` like a plain ViT's and rollout, the gradient methods and every view go through both
kinds as the model computes them:

- a self-attention layer's map holds its patch-to-patch softmax; the class token, which does not exist yet (it is a
  parameter that no layer has touched), attends to itself alone (row ``e₀``), and no patch attends to it;
- a class-attention layer's class-token row is its softmax over the class token and the patches; every patch row is
  ``e_i``: the layer leaves the patches as they are.

CaiT's self-attention mixes its heads twice (talking heads): the logits before the softmax (``proj_l``), and the softmax
maps after it (``proj_w``), so that each head's values are weighted by a mix of every head's softmax. A head's map here is
its own softmax ``[n, n]``, after ``proj_l`` and before ``proj_w``: a distribution over the keys, like every other
family's; ``proj_w`` is a linear step after it, as the out-projection is. The capture hooks ``proj_w``'s input for it,
and the class attention's ``attn_drop`` on its explicit path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.timm_adapter import TimmAdapter, fused_attention


def self_attention_map(patch_maps: torch.Tensor) -> torch.Tensor:
    """A self-attention layer's map on the whole sequence ``[b, heads, 1 + p, 1 + p]`` from its patch maps
    ``[b, heads, p, p]``: the class token, not yet in the sequence, attends to itself alone."""
    whole = F.pad(patch_maps, (1, 0, 1, 0))
    own = torch.zeros_like(whole)
    own[..., 0, 0] = 1.0
    return whole + own  # not written in place: the patch maps stay in the autograd graph


def class_attention_map(class_row: torch.Tensor) -> torch.Tensor:
    """A class-attention layer's map on the whole sequence ``[b, heads, n, n]`` from its class-token row
    ``[b, heads, 1, n]``: each patch keeps itself (the layer does not change the patches)."""
    n = class_row.shape[-1]
    unchanged = torch.eye(n, dtype=class_row.dtype, device=class_row.device)[1:].expand(*class_row.shape[:2], n - 1, n)
    return torch.cat([class_row, unchanged], dim=-2)


class CaitAdapter(TimmAdapter):
    """timm's ``Cait``: the talking-heads softmax of each self-attention layer (``proj_w``'s input) and the class
    attention's ``attn_drop``, on one sequence with the class token first (the module's docstring)."""

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        patch_embed = getattr(module, "patch_embed", None)
        class_blocks = getattr(module, "blocks_token_only", None)
        return (
            type(module).__module__.startswith("timm.")
            and getattr(module, "cls_token", None) is not None
            and bool(class_blocks) and bool(getattr(module, "blocks", None))
            and all(isinstance(getattr(block.attn, "proj_w", None), nn.Linear) for block in module.blocks)
            and all(isinstance(getattr(block.attn, "attn_drop", None), nn.Dropout) and hasattr(block.attn, "fused_attn")
                    for block in class_blocks)
            and all(hasattr(patch_embed, size) for size in ("img_size", "grid_size", "patch_size"))
        )

    reads_attention_inputs = False

    def recorded_inputs(self, module: nn.Module, record: Callable) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        raise VitExplorerError("CaiT mixes its heads' logits before the softmax (talking heads), so no head's map is the "
                               "softmax of its own queries against its keys: its maps are captured whole")

    def family_notes(self, module: nn.Module) -> list[str]:
        first_class = self.num_self_attention(module)
        return [f"CaiT: the class token exists only in the last {len(module.blocks_token_only)} layers (class attention, "
                f"layers {first_class}…{first_class + len(module.blocks_token_only) - 1}), where it alone attends and the "
                f"patches pass unchanged; in layers 0…{first_class - 1} the patches attend to each other and the class "
                "token is drawn attending to itself. A self-attention head's map is its own softmax; its values are "
                "weighted by a mix of every head's (talking heads)"]

    def num_self_attention(self, module: nn.Module) -> int:
        return len(module.blocks)

    def blocks(self, module: nn.Module) -> list[nn.Module]:
        return [*module.blocks, *module.blocks_token_only]

    def map_shape(self, module: nn.Module) -> tuple[int, int]:
        return len(self.blocks(module)), module.blocks[0].attn.num_heads

    def softmax_modules(self, module: nn.Module) -> list[nn.Module]:
        return [block.attn.proj_w for block in module.blocks] + [block.attn.attn_drop for block in module.blocks_token_only]

    @contextmanager
    def unfused(self, module: nn.Module) -> Iterator[None]:
        class_attentions = [block.attn for block in module.blocks_token_only]
        with fused_attention(class_attentions, False):
            yield

    @contextmanager
    def edited(self, module: nn.Module,
               edits: Mapping[int, Callable[[torch.Tensor], torch.Tensor]]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        first_class = self.num_self_attention(module)
        hooked = self.softmax_modules(module)

        def edit_patches(layer: int, _module: nn.Module, inputs: tuple) -> tuple:
            softmax = inputs[0].permute(0, 3, 1, 2)  # ``proj_w`` mixes heads on the last axis: [b, p, p, heads]
            edited = edits[layer](self_attention_map(softmax))
            return (edited[..., 1:, 1:].permute(0, 2, 3, 1),)

        def edit_class(layer: int, _module: nn.Module, _inputs: tuple, output: torch.Tensor) -> torch.Tensor:
            return edits[layer](class_attention_map(output))[..., :1, :]

        with ExitStack() as stack:
            stack.enter_context(self.unfused(module))
            for layer in edits:
                handle = (hooked[layer].register_forward_pre_hook(partial(edit_patches, layer)) if layer < first_class
                          else hooked[layer].register_forward_hook(partial(edit_class, layer)))
                stack.callback(handle.remove)
            yield partial(self.logits, module)

    @contextmanager
    def layer_outputs(self, module: nn.Module, record: Callable[[int, torch.Tensor], None]) -> Iterator[None]:
        first_class = self.num_self_attention(module)

        def after_patches(layer: int, _module: nn.Module, _inputs: tuple, patches: torch.Tensor) -> None:
            record(layer, torch.cat([module.cls_token.expand(patches.shape[0], -1, -1), patches], dim=1))

        def after_class(layer: int, _module: nn.Module, inputs: tuple, class_token: torch.Tensor) -> None:
            record(layer, torch.cat([class_token, inputs[0]], dim=1))

        with ExitStack() as stack:
            for layer, block in enumerate(self.blocks(module)):
                hook = after_patches if layer < first_class else after_class
                stack.callback(block.register_forward_hook(partial(hook, layer)).remove)
            yield

    @contextmanager
    def branched(self, module: nn.Module, layer: int, copies: int) -> Iterator[None]:
        if layer < self.num_self_attention(module):
            with super().branched(module, layer, copies):
                yield
            return

        # the class-attention layers read the patches of the last self-attention layer, each of them: widening those
        # patches runs every class-attention layer once per copy (those below ``layer`` repeat the same values)
        def widen(_module: nn.Module, _inputs: tuple, patches: torch.Tensor) -> torch.Tensor:
            if patches.shape[0] != 1:
                raise RuntimeError(f"{type(self).__name__} can branch the residual stream of one image")
            return patches.expand(copies, *patches.shape[1:]).contiguous()

        handle = module.blocks[-1].register_forward_hook(widen)
        try:
            yield
        finally:
            handle.remove()

    def attention_writes(self, module: nn.Module) -> list[nn.Module]:
        raise VitExplorerError("CaiT's blocks add gamma_1 · attn(norm1(x)) with no module that outputs it, and its "
                               "self-attention heads each write a mix of every head's map (talking heads): its prediction "
                               "is not split over heads")

    def head_projections(self, module: nn.Module) -> list[nn.Module]:
        raise VitExplorerError("CaiT's self-attention heads each write a mix of every head's map (talking heads), so one "
                               "head's output cannot be patched alone")

    def mlp_activations(self, module: nn.Module) -> list[nn.Module]:
        raise VitExplorerError("CaiT adds its class token only in the class-attention layers at the end, so a test-time "
                               "register has no place to enter with the patches")

