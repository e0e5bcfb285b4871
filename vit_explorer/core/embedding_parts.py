"""What each part of the model writes directly into the image embedding, as vectors of the embedding's own space.

The decomposition (``core.decomposition``) splits one score; TextSpan and the head atlas need each head's whole output
in the joint image-text space, over many images. The same reading gives it. With every norm of the read-out (the final
norm, a norm in the pooling) held at the standard deviation it has on the image's own last stream, the read-out from
the stream to the embedding (the model's final norm, pooling and projection, ``CaptureAdapter.final_tokens`` and
``pool``) is affine: ``embed(x) = J·x + embed(0)`` (Gandelsman et al., ICLR 2024, hold the final norm the same way). So
the embedding is exactly the sum of ``J`` applied to each part of the last stream: what entered the first layer, each
layer's MLP, each layer's attention biases (its write with every map at zero), and each head of each layer, plus the
read-out's own bias ``embed(0)``. A head's vector is its share of its layer's attention write through ``J``: the write is
affine in the heads' outputs concatenated at the out-projection's input ``X`` (``CaptureAdapter.head_projections``), so a
head's share is Σ X_h·∂(J·write)/∂X_h over its slice, one backward pass per embedding dimension (batched), read for every
image of the batch at once. (The same share as Σ A_h·∂(J·write)/∂A_h over the post-softmax map, as the decomposition
reads a score, at a fraction of the cost: the gradient is ``[n, heads·head_dim]`` per dimension, not ``[heads, n, n]``.)

These are direct effects only: what a head writes that later layers read and transform is counted in those layers'
parts. The embedding is the one before a CLIP model's unit normalisation (a cosine reads its direction).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from vit_explorer.core.capture import LayerSink, capture_lock
from vit_explorer.core.decomposition import held_norms, recording_streams, zero_map_writes
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import CaptureAdapter, LoadedModel

# embedding dimensions read per backward pass: a batch of gradients [dims, b, n, heads · head_dim] at a time
DIMS_PER_PASS = 16


@dataclass(frozen=True)
class EmbeddingParts:
    """A batch of images' embeddings as sums of what each part of the model writes into them (float64).

    Attributes:
        heads: each head's direct output ``[b, layers, heads, dim]``.
        mlps: each layer's MLP's ``[b, layers, dim]``.
        attention_biases: each layer's attention write with its map at zero ``[b, layers, dim]``.
        embeddings: what entered the first layer (patch embeddings, prefix tokens, position embedding) ``[b, dim]``.
        readout_bias: the read-out's own bias (its norms' and projection's) ``[b, dim]``.
        embedding: what is read out, the image embedding by default, as the model computes it ``[b, dim]``.
        targets: each image's class whose score was read ``[b]`` (``score_readout``); None where none was.
        maps: the pass's attention maps, per layer ``[b, heads, n, n]``.
    """

    heads: torch.Tensor
    mlps: torch.Tensor
    attention_biases: torch.Tensor
    embeddings: torch.Tensor
    readout_bias: torch.Tensor
    embedding: torch.Tensor
    targets: torch.Tensor | None = None
    maps: tuple[torch.Tensor, ...] = ()

    @property
    def rest(self) -> torch.Tensor:
        """Everything that is no head ``[b, dim]``: the MLPs, the attention biases, the embeddings, the read-out's bias."""
        return self.mlps.sum(dim=1) + self.attention_biases.sum(dim=1) + self.embeddings + self.readout_bias

    @property
    def total(self) -> torch.Tensor:
        """The parts' sum ``[b, dim]``: the embedding, up to float rounding."""
        return self.heads.sum(dim=(1, 2)) + self.rest


# what the parts are parts of: given the model, its adapter and the last stream ``[b, n, dim]`` of a pass, the read-out
# from a stream ``[b, n, dim]`` to what is split ``[b, dim']``, and each image's target class (None where none is read)
Readout = Callable[[nn.Module, CaptureAdapter, torch.Tensor], tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor | None]]


def embedding_readout(module: nn.Module, adapter: CaptureAdapter,
                      last: torch.Tensor) -> tuple[Callable[[torch.Tensor], torch.Tensor], None]:
    """The image embedding ``[b, dim']``: the model's final norm, pooling and projection (before a cosine's unit norm)."""
    return (lambda stream: adapter.pool(module, adapter.final_tokens(module, stream))), None


def score_readout(module: nn.Module, adapter: CaptureAdapter,
                  last: torch.Tensor) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor | None]:
    """Each image's own answer ``[b, 1]``: its top class's logit (a CLIP model's best prompt, given as its classes), or
    for a backbone the projection of its embedding on its own embedding's direction."""
    with torch.no_grad():
        logits = adapter.classify(module, last.detach())
    if logits.shape[1]:
        targets = logits.argmax(dim=1)
        return (lambda stream: adapter.classify(module, stream).gather(1, targets[:, None])), targets
    read, _ = embedding_readout(module, adapter, last)
    with torch.no_grad():
        direction = torch.nn.functional.normalize(read(last.detach()), dim=-1)  # [b, dim']
    return (lambda stream: (read(stream) * direction).sum(dim=-1, keepdim=True)), None


def embedding_parts(model: LoadedModel, pixels: torch.Tensor, readout: Readout = embedding_readout) -> EmbeddingParts:
    """What ``readout`` reads of each image of ``pixels`` ``[b, 3, H, W]`` (by default its embedding; ``score_readout``:
    its own answer) split over the model's parts (module doc), with the pass's attention maps: one forward pass, and per
    layer one backward pass per ``DIMS_PER_PASS`` dimensions read. Raises, with the reason, for a model whose attention
    writes cannot be read (``CaptureAdapter.attention_writes``) or whose parts do not add up."""
    module, adapter = model.module, model.adapter
    adapter.stream_entries(module)
    adapter.attention_writes(module)  # refuses a family whose writes are unknown, before any pass
    projections = adapter.head_projections(module)
    heads = model.map_shape[1]
    with capture_lock(module):
        zero_writes = zero_map_writes(module, adapter, pixels[:1])  # [layers, n, dim]
        inputs: dict[int, torch.Tensor] = {}
        handles = [projection.register_forward_pre_hook(partial(record_input, inputs, layer))
                   for layer, projection in enumerate(projections)]
        graph = LayerSink()
        try:
            # the capture's path: a family's fused attention may not call its out-projection as a module
            with recording_streams(module, adapter) as streams, adapter.attached(module, graph) as forward, \
                    torch.enable_grad():
                forward(pixels.detach().requires_grad_(True))
                last = streams["after", len(projections) - 1]
                read, targets = readout(module, adapter, last)
                with held_norms(adapter.layer_norms(module)):
                    whole = read(last.detach()).double()  # the image's own scales, held from here on
                    parts = read_parts(read, streams, [inputs[layer] for layer in range(len(projections))], heads,
                                       zero_writes)
        finally:
            for handle in handles:
                handle.remove()
    maps = tuple(attention.detach() for attention in graph.in_layer_order())  # per layer [b, heads, n, n], not copied
    result = EmbeddingParts(*parts, embedding=whole.detach(), targets=targets, maps=maps)
    error = (result.total - result.embedding).abs().max()
    if error > 1e-3 * max(1.0, float(result.embedding.abs().max())):
        raise VitExplorerError(f"{model.name}'s parts do not add up to what it reads out (off by {float(error):.3g}): its "
                               "read-out is not affine once its norms' scale is held, or its attention write is not affine "
                               "in its heads' outputs")
    return result


def record_input(inputs: dict[int, torch.Tensor], layer: int, _module: nn.Module, arguments: tuple) -> None:
    inputs[layer] = arguments[0]


def read_parts(read: Callable[[torch.Tensor], torch.Tensor], streams: dict, head_inputs: list[torch.Tensor], heads: int,
               zero_writes: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(heads, MLPs, attention biases, embeddings, read-out bias) through the held read-out ``read`` from the recorded
    ``streams`` and each layer's out-projection input in the graph ``[b, n, heads · head_dim]``."""
    entry = streams["entry"]
    bias = read(torch.zeros_like(entry.detach()))  # [b, dim']

    def linear(stream: torch.Tensor) -> torch.Tensor:
        return read(stream) - bias

    shares, mlps, biases = [], [], []
    before = entry.detach()
    for layer, head_input in enumerate(head_inputs):
        write = linear(streams["write", layer])  # [b, dim'] in the graph of the heads' outputs
        shares.append(head_outputs(write, head_input, heads))
        after = streams["after", layer].detach()
        with torch.no_grad():
            mlps.append(linear(after) - linear(before) - write.detach())
            biases.append(linear(zero_writes[layer][None].expand_as(after)))
        before = after
    with torch.no_grad():
        embeddings = linear(entry.detach())
    return (torch.stack(shares, dim=1).double(), torch.stack(mlps, dim=1).double(), torch.stack(biases, dim=1).double(),
            embeddings.double(), bias.detach().double())


def head_outputs(write: torch.Tensor, head_input: torch.Tensor, heads: int) -> torch.Tensor:
    """Each head's share ``[b, heads, dim']`` of a layer's write through the read-out ``write`` ``[b, dim']``, in the graph of
    the out-projection's input ``head_input`` ``[b, n, heads · head_dim]``: Σ X_h·∂write/∂X_h per dimension,
    ``DIMS_PER_PASS`` dimensions per pass."""
    dims = write.shape[1]
    by_head = head_input.detach().unflatten(-1, (heads, -1))  # [b, n, heads, head_dim]
    shares = []
    for start in range(0, dims, DIMS_PER_PASS):
        chosen = torch.eye(dims, dtype=write.dtype, device=write.device)[start : start + DIMS_PER_PASS]  # [k, dim']
        directions = chosen[:, None, :].expand(-1, write.shape[0], -1)  # [k, b, dim']: each image's own sum
        if dims == 1:  # one score per image: one plain backward pass, no batching over directions
            (gradient,) = torch.autograd.grad(write, head_input, directions[0], retain_graph=True)
            gradient = gradient[None]
        else:
            (gradient,) = torch.autograd.grad(write, head_input, directions, retain_graph=True, is_grads_batched=True)
        shares.append((by_head[None] * gradient.unflatten(-1, (heads, -1))).sum(dim=(2, 4)))  # [k, b, heads]
    return torch.cat(shares).permute(1, 2, 0)  # [b, heads, dim']
