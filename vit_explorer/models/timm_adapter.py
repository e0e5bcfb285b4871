"""Adapter for timm ViT-style models (ViT, DeiT, DINO, DINOv2 with registers, CLIP towers, EVA, BEiT).

timm computes attention with ``scaled_dot_product_attention`` when ``fused_attn`` is set, which no
hook can see. Each block's attention module also has an explicit path,
``softmax → attn_drop → @ v``; for the capture the adapter flips ``fused_attn`` off on every block
(it is read per module, so the global ``set_fused_attn`` would not reach built models), hooks
``attn_drop``, and restores each flag afterwards.

A pass without gradients into a sink that keeps every whole map (``slot``) goes one step further for timm's plain
``Attention``: its softmax is computed straight into the sink's place for the map (``attention_in_place``), which saves
a copy of every map and the allocation of two more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from contextlib import ExitStack, contextmanager
from functools import partial

import torch
from torch import nn

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import (
    ELEMENTWISE,
    HookAdapter,
    insert_zero_token,
    listed,
    map_place,
    softmax_in_place,
)
from vit_explorer.models.layout import TokenLayout, check_input_hw


def require_timm():
    try:
        import timm
    except ImportError:
        raise VitExplorerError("timm models need the timm package: pip install 'vit-explorer[timm]'") from None
    return timm


def attention_modules(module: nn.Module) -> list[nn.Module | None]:
    """Each block's ``attn`` (None for a block without one: Twins', CrossViT's and TNT's blocks are not a ViT's)."""
    return [getattr(block, "attn", None) for block in getattr(module, "blocks", [])]


@contextmanager
def fused_attention(attentions: list[nn.Module], fused: bool) -> Iterator[None]:
    """``attentions`` (timm attention modules) on timm's fused path (SDPA) or their explicit one while active; each flag
    restored on exit."""
    saved = [attention.fused_attn for attention in attentions]
    try:
        for attention in attentions:
            attention.fused_attn = fused
        yield
    finally:
        for attention, flag in zip(attentions, saved, strict=True):
            attention.fused_attn = flag


class TimmAdapter(HookAdapter):
    """Hooks ``blocks[i].attn.attn_drop`` with fused attention switched off during capture."""

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        """A plain ViT: one patch grid (``patch_embed`` with its size, grid and patch), prefix tokens, and blocks whose
        ``attn`` is a softmax over all tokens. XCiT's ``blocks[i].attn`` attends over channels, and the hierarchical
        families (Swin, Hiera, MViT, PVT, LeViT) have no single grid: their ``patch_embed`` lacks those sizes."""
        attentions = attention_modules(module)
        patch_embed = getattr(module, "patch_embed", None)
        return (
            type(module).__module__.startswith("timm.")
            and bool(attentions)
            and all(hasattr(attention, "fused_attn") and isinstance(getattr(attention, "attn_drop", None), nn.Dropout)
                    for attention in attentions)
            and hasattr(module, "num_prefix_tokens")
            and all(hasattr(patch_embed, size) for size in ("img_size", "grid_size", "patch_size"))
            # its patches are cut from the image itself, not from a convolutional stem's features (ViTamin, hybrids)
            and [g * p for g, p in zip(patch_embed.grid_size, patch_embed.patch_size, strict=True)] == list(patch_embed.img_size)
        )

    def softmax_modules(self, module: nn.Module) -> list[nn.Module]:
        return [attention.attn_drop for attention in attention_modules(module)]

    def blocks(self, module: nn.Module) -> list[nn.Module]:
        return list(module.blocks)

    def num_classes(self, module: nn.Module) -> int:
        return int(module.num_classes)

    reads_attention_inputs = True  # every timm attention ``matches`` admits calls SDPA once when ``fused_attn`` is set

    @contextmanager
    def unfused(self, module: nn.Module) -> Iterator[None]:
        with fused_attention(attention_modules(module), False):
            yield

    @contextmanager
    def fused(self, module: nn.Module) -> Iterator[None]:
        with fused_attention(attention_modules(module), True):
            yield

    @contextmanager
    def attached(self, module: nn.Module,
                 sink: MutableMapping[int, torch.Tensor]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        with ExitStack() as stack:
            forward = stack.enter_context(super().attached(module, sink))
            slot = getattr(sink, "slot", None)
            attentions = attention_modules(module)
            timm = require_timm()
            if slot is not None and all(type(attention) is timm.layers.Attention for attention in attentions):
                for layer, attention in enumerate(attentions):
                    # an instance attribute shadows the class's forward for this module only
                    attention.forward = partial(attention_in_place, attention, partial(slot, layer))
                    stack.callback(attention.__dict__.pop, "forward", None)
            yield forward

    def attention_writes(self, module: nn.Module) -> list[nn.Module]:
        # a pre-norm block adds ``ls1(attn(norm1(x)))``; BEiT's and EVA's ``gamma_1``, a norm inside the attention
        # (``scale_norm``) or a post-norm block write something else
        writes = []
        for block in module.blocks:
            inner_norm = getattr(block.attn, "norm", None)
            if not hasattr(block, "ls1") or not isinstance(getattr(block.attn, "proj", None), nn.Linear) or not (
                    inner_norm is None or isinstance(inner_norm, nn.Identity)):
                raise VitExplorerError(f"{type(block).__name__} blocks do not add ls1(attn(norm1(x))) to the residual stream, so "
                                       "their heads' direct contributions cannot be read off exactly")
            writes.append(block.ls1)
        return writes

    def head_projections(self, module: nn.Module) -> list[nn.Module]:
        return [block.attn.proj for block in module.blocks]

    def logits(self, module: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        output = module(pixels)
        # with num_classes=0 timm returns pooled features, which are not class scores
        return output if module.num_classes else output.new_zeros(output.shape[0], 0)

    def classify(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        if not module.num_classes:
            return hidden.new_zeros(hidden.shape[0], 0)
        # ``forward_features`` ends in ``norm``; ``forward_head`` pools (class token, mean, distillation) and classifies
        return module.forward_head(self.final_tokens(module, hidden))

    def final_tokens(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return module.norm(hidden)

    def pool(self, module: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        return module.forward_head(tokens, pre_logits=True)

    def mlp_activations(self, module: nn.Module) -> list[nn.Module]:
        mlps = [block.mlp for block in module.blocks]
        # timm's ``Mlp``: fc1 → act → drop → norm → fc2; a gated MLP (SwiGLU) multiplies after its activation
        if not all(type(mlp).__name__ == "Mlp" for mlp in mlps):
            raise VitExplorerError(f"{type(mlps[0]).__name__}: this MLP is gated (SwiGLU-like), so its neurons are not the "
                                   "output of one activation; a test-time register needs a plain MLP")
        return [mlp.act for mlp in mlps]

    def add_prefix_token(self, module: nn.Module, at: int) -> None:
        if type(module).__name__ != "VisionTransformer":
            raise VitExplorerError(f"{type(module).__name__}: a test-time register is added to timm's VisionTransformer only "
                                   "(a model with rotary position embeddings places its patches by their count)")
        # ``forward_features``: patch embedding, position embedding, ``patch_drop``, ``norm_pre``, the blocks. The token
        # goes in after the position embedding and before ``norm_pre`` (CLIP's ``ln_pre``), where Jiang et al. put it in
        # their CLIP; pooling skips ``num_prefix_tokens``
        module.patch_drop.register_forward_hook(partial(insert_zero_token, at))
        module.num_prefix_tokens += 1

    def activations(self, module: nn.Module) -> list[nn.Module]:
        return timm_activations(module)

    def map_shape(self, module: nn.Module) -> tuple[int, int]:
        attentions = attention_modules(module)
        return len(attentions), attentions[0].num_heads

    def layout(self, module: nn.Module, input_hw: tuple[int, int]) -> TokenLayout:
        names: list[str] = []
        if getattr(module, "cls_token", None) is not None:
            names.append("cls")
        if getattr(module, "dist_token", None) is not None:
            names.append("dist")
        names += [f"reg{i + 1}" for i in range(num_registers(module))]
        if len(names) != module.num_prefix_tokens:
            raise VitExplorerError(f"{type(module).__name__}: its {module.num_prefix_tokens} prefix tokens are not the class, "
                                   f"distillation and register tokens vit_explorer knows ({listed(names) or 'none'}), so its "
                                   "patches cannot be placed on the grid")
        patch_embed = module.patch_embed
        if getattr(module, "dynamic_img_size", False):
            grid = tuple(patch_embed.dynamic_feat_size(input_hw))
        else:
            grid = tuple(patch_embed.grid_size)
            expected = tuple(g * p for g, p in zip(grid, patch_embed.patch_size, strict=True))
            check_input_hw(input_hw, tuple(patch_embed.patch_size))
            if tuple(input_hw) != expected:
                raise VitExplorerError(f"this timm model takes {expected[0]}×{expected[1]} inputs, not "
                                       f"{input_hw[0]}×{input_hw[1]}")
        return TokenLayout(prefix_names=tuple(names), grid_hw=grid, patch_hw=tuple(patch_embed.patch_size))


def timm_activations(module: nn.Module) -> list[nn.Module]:
    """Every element-wise non-linearity of a timm model: timm's own (GELUTanh, QuickGELU, ...) live in
    timm.layers.activations."""
    return [part for part in module.modules()
            if isinstance(part, ELEMENTWISE) or type(part).__module__.startswith("timm.layers.activations")]


def num_registers(module: nn.Module) -> int:
    """The register tokens of a timm model: ``VisionTransformer`` counts them in ``num_reg_tokens``, ``Eva`` only in the
    shape of its ``reg_token`` ``[1, registers, dim]``."""
    registers = getattr(module, "reg_token", None)
    return registers.shape[1] if registers is not None else getattr(module, "num_reg_tokens", 0)


def attention_in_place(attention: nn.Module, slot: Callable[..., torch.Tensor | None], x: torch.Tensor,
                       attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
    """timm's ``Attention.forward`` on its explicit path, with q·kᵀ and the softmax written into ``slot(shape, dtype,
    device)``, the sink's place for this layer's map ``[b, heads, n, n]``. ``attn_drop`` still sees the map, so the
    capture's hook (and any edit) works as on timm's own path. Where the map cannot be written there (``map_place``),
    timm's own forward runs."""
    b, n, _ = x.shape
    place = map_place(slot, (b, attention.num_heads, n, n), x.dtype, x.device, plain=attn_mask is None and not is_causal)
    if place is None:
        return type(attention).forward(attention, x, attn_mask, is_causal)
    gate = attention.gate(x).sigmoid() if getattr(attention, "gate", None) is not None else None
    q, k, v = attention.qkv(x).reshape(b, n, 3, attention.num_heads, attention.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = attention.q_norm(q), attention.k_norm(k)
    torch.matmul(q * attention.scale, k.transpose(-2, -1), out=place)
    x = (attention.attn_drop(softmax_in_place(place)) @ v).transpose(1, 2).reshape(b, n, -1)
    x = getattr(attention, "norm", nn.Identity())(x)
    if gate is not None:
        x = x * gate
    return attention.proj_drop(attention.proj(x))
