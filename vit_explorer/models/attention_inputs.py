"""What each layer's attention is computed from: its queries, its keys and an additive term of its logits.

Every map a view shows is softmax(q·kᵀ + bias) of one layer and head, and q and k grow with the tokens n where the maps
grow with n². So a family whose attention runs through ``torch.nn.functional.scaled_dot_product_attention`` (SDPA) is
read while it runs on that fused path: ``recording_sdpa`` watches every SDPA call of the forward (a torch function mode:
this thread only, the model's own arithmetic untouched, so its logits are its own bit for bit) and hands each call's
inputs, with the layer whose block made it, to a record function. The queries are kept scaled, so that a map is
``softmax(queries @ keysᵀ + bias)`` with nothing else to know: whatever the model applies before SDPA (RoPE, a norm of q
and k, its scale) is already in them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode


@dataclass(frozen=True)
class AttentionInputs:
    """One layer's attention logits, as the parts they are made of: the map of head h is
    ``softmax(queries[:, h] @ keys[:, h]ᵀ + bias[:, h])`` over the last axis.

    Attributes:
        queries: ``[b, heads, n, head_dim]``, already multiplied by the attention's scale.
        keys: ``[b, heads, n, head_dim]``.
        bias: an additive term of the logits, broadcastable to ``[b, heads, n, n]`` (a relative-position bias, a mask with
            ``-inf`` where a key is hidden), or None.
    """

    queries: torch.Tensor
    keys: torch.Tensor
    bias: torch.Tensor | None = None


def additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """SDPA's ``attn_mask`` as a term added to the logits: a boolean mask keeps where True (``-inf`` elsewhere)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, -math.inf)


def sdpa_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                scale: float | None = None, enable_gqa: bool = False) -> AttentionInputs:
    """The ``AttentionInputs`` of one call of ``scaled_dot_product_attention`` with these arguments (its signature)."""
    if is_causal or enable_gqa or query.shape[1] != key.shape[1]:
        raise NotImplementedError("a causal or grouped-query attention is not a ViT's self-attention")
    factor = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    return AttentionInputs(query * factor, key, additive(attn_mask, query.dtype))


class SdpaRecorder(TorchFunctionMode):
    """Hands the inputs of every SDPA call made inside a layer's block while active to ``record(layer, inputs)``; a call
    outside every block (SigLIP's attention-pooling head) is not a layer's and is left alone.

    A torch function mode is popped while it handles a call, so an SDPA call made inside another torch function
    (``F.multi_head_attention_forward``) is not seen: such a family's adapter calls SDPA itself (OpenCLIP's)."""

    def __init__(self, record: Callable[[int, AttentionInputs], None], num_layers: int) -> None:
        super().__init__()
        self.record = record
        self.layer: int | None = None  # the block running now
        self.calls = [0] * num_layers  # SDPA calls seen per layer

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and self.layer is not None:
            self.record(self.layer, sdpa_inputs(*args, **kwargs))
            self.calls[self.layer] += 1
        return func(*args, **kwargs)

    def entered(self, layer: int, *_) -> None:
        self.layer = layer

    def left(self, *_) -> None:
        self.layer = None


@contextmanager
def recording_sdpa(record: Callable[[int, AttentionInputs], None], blocks: list[nn.Module]) -> Iterator[SdpaRecorder]:
    """While active, every SDPA call of this thread inside one of ``blocks`` (one per layer, in layer order) is recorded
    as that layer's (``SdpaRecorder``); on a clean exit, a forward that did not make one call per layer and pass is a
    family whose attention is not what its adapter says, and fails loudly."""
    recorder = SdpaRecorder(record, len(blocks))
    handles = [handle for layer, block in enumerate(blocks)
               for handle in (block.register_forward_pre_hook(partial(recorder.entered, layer)),
                              block.register_forward_hook(recorder.left))]
    try:
        with recorder:
            yield recorder
    finally:
        for handle in handles:
            handle.remove()
    if len(set(recorder.calls)) != 1 or not recorder.calls[0]:
        raise RuntimeError(f"the forward made {recorder.calls} fused attention calls in its {len(blocks)} layers: this family "
                           "does not compute its attention with one scaled_dot_product_attention call per layer")
