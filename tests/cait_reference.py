"""CaiT's forward written out from its parameters (Touvron et al., 2021, as timm's ``Cait`` holds them), independent of
vit_explorer's adapter: each layer's softmax in its own shape, the residual stream after each layer, and the logits, with
an optional head whose softmax is zeroed."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class CaitPass:
    logits: torch.Tensor  # [b, classes]
    patch_softmaxes: list[torch.Tensor]  # per self-attention layer [b, heads, p, p], after proj_l, before proj_w
    class_softmaxes: list[torch.Tensor]  # per class-attention layer [b, heads, 1, 1 + p]
    streams: list[torch.Tensor]  # the class token then the patches after every layer [b, 1 + p, dim]


def heads_of(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[b, n, heads · d] → [b, heads, n, d]."""
    b, n, width = x.shape
    return x.reshape(b, n, heads, width // heads).transpose(1, 2)


def joined(x: torch.Tensor) -> torch.Tensor:
    """[b, heads, n, d] → [b, n, heads · d]."""
    return x.transpose(1, 2).flatten(2)


def cait_pass(module, pixels: torch.Tensor, zeroed: tuple[int, int] | None = None, grad: bool = False) -> CaitPass:
    """The pass of timm ``Cait`` ``module`` over ``pixels``; ``zeroed`` = (layer, head) counts the self-attention layers
    first, then the class-attention ones; ``grad`` keeps every softmax in the graph with its gradient retained."""
    x = module.patch_embed(pixels) + module.pos_embed
    b = x.shape[0]
    cls = module.cls_token.expand(b, -1, -1)
    patch_softmaxes, class_softmaxes, streams = [], [], []
    for layer, block in enumerate(module.blocks):
        attention = block.attn
        h = attention.num_heads
        normed = block.norm1(x)
        q, k, v = (heads_of(part, h) for part in attention.qkv(normed).chunk(3, dim=-1))
        logits = (q * attention.scale) @ k.transpose(-1, -2)  # [b, heads, p, p]
        # talking heads: a linear map over the head axis, before and after the softmax
        mixed = torch.einsum("bhij,gh->bgij", logits, attention.proj_l.weight) + attention.proj_l.bias[:, None, None]
        softmax = mixed.softmax(dim=-1)
        if grad:
            softmax.retain_grad()
        patch_softmaxes.append(softmax)
        if zeroed is not None and zeroed[0] == layer:
            softmax = softmax * (torch.arange(h) != zeroed[1]).to(softmax.dtype)[:, None, None]
        weights = torch.einsum("bhij,gh->bgij", softmax, attention.proj_w.weight) + attention.proj_w.bias[:, None, None]
        x = x + block.gamma_1 * attention.proj(joined(weights @ v))
        x = x + block.gamma_2 * block.mlp(block.norm2(x))
        streams.append(torch.cat([cls, x], dim=1))
    first_class = len(module.blocks)
    for offset, block in enumerate(module.blocks_token_only):
        attention = block.attn
        h = attention.num_heads
        u = block.norm1(torch.cat([cls, x], dim=1))
        q = heads_of(attention.q(u[:, :1]), h)
        k, v = heads_of(attention.k(u), h), heads_of(attention.v(u), h)
        softmax = ((q * attention.scale) @ k.transpose(-1, -2)).softmax(dim=-1)  # [b, heads, 1, 1 + p]
        if grad:
            softmax.retain_grad()
        class_softmaxes.append(softmax)
        if zeroed is not None and zeroed[0] == first_class + offset:
            softmax = softmax * (torch.arange(h) != zeroed[1]).to(softmax.dtype)[:, None, None]
        cls = cls + block.gamma_1 * attention.proj(joined(softmax @ v))
        cls = cls + block.gamma_2 * block.mlp(block.norm2(cls))
        streams.append(torch.cat([cls, x], dim=1))
    final = module.norm(torch.cat([cls, x], dim=1))
    return CaitPass(F.linear(final[:, 0], module.head.weight, module.head.bias), patch_softmaxes, class_softmaxes, streams)
