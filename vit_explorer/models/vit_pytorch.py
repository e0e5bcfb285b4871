"""Adapter for this project's ViT and for lucidrains' vit-pytorch ``ViT`` (the same module tree)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from einops import rearrange
from torch import nn

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.attention_inputs import AttentionInputs
from vit_explorer.models.base import HookAdapter, insert_zero_token
from vit_explorer.models.layout import TokenLayout
from vit_explorer.models.vit import ViT

VIT_ARGUMENTS = {"image_size", "patch_size", "num_classes", "dim", "depth", "heads", "mlp_dim", "pool", "channels", "dim_head",
                 "dropout", "emb_dropout"}
REQUIRED_ARGUMENTS = {"image_size", "patch_size", "num_classes", "dim", "depth", "heads", "mlp_dim"}


def build_vit(config: dict[str, Any], source: str) -> ViT:
    """A ViT from the keyword arguments in ``config`` (as vit-pytorch's ``ViT`` takes them)."""
    unknown = set(config) - VIT_ARGUMENTS
    missing = REQUIRED_ARGUMENTS - set(config)
    if unknown or missing:
        raise VitExplorerError(
            f"{source}: ViT config has {'unknown keys ' + str(sorted(unknown)) if unknown else ''}"
            f"{' and ' if unknown and missing else ''}{'missing keys ' + str(sorted(missing)) if missing else ''}"
        )
    args = {key: tuple(value) if isinstance(value, list) else value for key, value in config.items()}
    try:
        return ViT(**args)
    except (TypeError, ValueError) as error:
        raise VitExplorerError(f"{source}: bad ViT config: {error}") from None


class VitPytorchAdapter(HookAdapter):
    """Hooks the ``attend`` softmax of every ``Attention`` in ``module.transformer.layers``."""

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        layers = getattr(getattr(module, "transformer", None), "layers", None)
        return (
            hasattr(module, "to_patch_embedding")
            and hasattr(module, "cls_token")
            and layers is not None
            and all(isinstance(getattr(layer[0], "attend", None), nn.Softmax) for layer in layers)
        )

    def softmax_modules(self, module: nn.Module) -> list[nn.Module]:
        return [attention.attend for attention, _ in module.transformer.layers]

    # its attention is written out (no SDPA to watch), so q and k are read where ``to_qkv`` makes them
    reads_attention_inputs = True

    @contextmanager
    def recorded_inputs(self, module: nn.Module,
                        record: Callable[[int, AttentionInputs], None]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        def read(layer: int, attention: nn.Module, _projection: nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
            # ``Attention.forward``: ``to_qkv(x).chunk(3)``, each ``b n (h d) -> b h n d``, logits (q·kᵀ)·scale
            queries, keys, _ = (rearrange(part, "b n (h d) -> b h n d", h=attention.heads) for part in output.chunk(3, dim=-1))
            record(layer, AttentionInputs(queries * attention.scale, keys))

        handles = [attention.to_qkv.register_forward_hook(partial(read, layer, attention))
                   for layer, (attention, _) in enumerate(module.transformer.layers)]
        try:
            yield partial(self.logits, module)
        finally:
            for handle in handles:
                handle.remove()

    def mlp_activations(self, module: nn.Module) -> list[nn.Module]:
        return [feed_forward.net[2] for _, feed_forward in module.transformer.layers]  # LayerNorm, Linear, GELU, …

    def add_prefix_token(self, module: nn.Module, at: int) -> None:
        if module.pool == "mean":
            raise VitExplorerError("this ViT pools the mean of all its tokens, which would take a test-time register in: "
                                   "only a class-token ViT can have one")
        # ``forward``: ``dropout(x + pos_embedding)`` is the stream entering the first block
        module.dropout.register_forward_hook(partial(insert_zero_token, at))

    def num_classes(self, module: nn.Module) -> int:
        head = getattr(module, "mlp_head", None)
        # vit-pytorch's head is a Linear or a Sequential ending in one; the seed ViT's is None for a backbone
        linears = [part for part in head.modules() if isinstance(part, nn.Linear)] if head is not None else []
        return linears[-1].out_features if linears else 0

    def classify(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        if self.num_classes(module) == 0:
            return hidden.new_zeros(hidden.shape[0], 0)
        return module.mlp_head(self.pool(module, self.final_tokens(module, hidden)))

    def final_tokens(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        # vit-pytorch's Transformer ends in a norm (older releases put it in the head instead)
        norm = getattr(module.transformer, "norm", None)
        return norm(hidden) if norm is not None else hidden

    def pool(self, module: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        return module.to_latent(tokens.mean(dim=1) if module.pool == "mean" else tokens[:, 0])

    def blocks(self, module: nn.Module) -> list[nn.Module]:
        return list(module.transformer.layers)  # each a ModuleList [attention, feed-forward]

    def residual_modules(self, module: nn.Module) -> list[nn.Module]:
        # a layer's ModuleList is never called (``Transformer.forward`` runs ``x = ff(x) + x`` itself), so the
        # residual after the layer is seen at its feed-forward: input plus output
        return [feed_forward for _, feed_forward in module.transformer.layers]

    def residual_after(self, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        return output + inputs[0]

    def with_residual(self, inputs: tuple, output: torch.Tensor, stream: torch.Tensor) -> torch.Tensor:
        return stream - inputs[0]

    def stream_entries(self, module: nn.Module) -> list[nn.Module]:
        # the layer's ModuleList is never called; its attention takes the stream, and ``attn(x) + x``
        # broadcasts the one-image residual over a widened attention output
        return [attention for attention, _ in module.transformer.layers]

    def attention_writes(self, module: nn.Module) -> list[nn.Module]:
        return [attention for attention, _ in module.transformer.layers]  # ``x = attn(x) + x``

    def head_projections(self, module: nn.Module) -> list[nn.Module]:
        # ``to_out`` is Linear then Dropout; one head as wide as the stream has no projection (an Identity)
        return [attention.to_out[0] if isinstance(attention.to_out, nn.Sequential) else attention.to_out
                for attention, _ in module.transformer.layers]

    def attention_width(self, module: nn.Module) -> int:
        return module.transformer.layers[0][0].to_qkv.out_features // 3  # one head as wide as the stream has no projection

    def map_shape(self, module: nn.Module) -> tuple[int, int]:
        return len(module.transformer.layers), module.transformer.layers[0][0].heads

    def layout(self, module: nn.Module, input_hw: tuple[int, int]) -> TokenLayout:
        patch_h, patch_w = module.patch_size
        if input_hw[0] % patch_h or input_hw[1] % patch_w:
            raise VitExplorerError(f"input {input_hw[0]}×{input_hw[1]} is not a multiple of the {patch_h}×{patch_w} patch")
        prefix = ("cls",) * module.cls_token.shape[0]
        return TokenLayout(prefix_names=prefix, grid_hw=(input_hw[0] // patch_h, input_hw[1] // patch_w),
                           patch_hw=(patch_h, patch_w))
