"""What each part of the model writes into its answer: the target's score as a sum over the residual stream's parts.

A pre-norm ViT's residual stream after its last layer is the sum of what entered the first layer (patch embeddings,
class token, registers, position embedding) and what every layer's attention and MLP added to it. The score is read
from that stream through the final norm, the model's pooling and its head. With the final norm's standard deviation
held at the image's own (Gandelsman et al., ICLR 2024, hold it the same way) that read-out is affine, so the score
splits exactly into the read-out's bias (the final norm's and the head's) plus the read-out's slope times each part:
the embeddings, each layer's MLP, each layer's attention biases, and each head of each layer, whose write is its
output through its slice of the out-projection and any layer scale. A head's part splits further over the tokens
it attended to: its write at query t is Σ_s A[t, s]·(its value of s, projected), so the part from source s is
Σ_t A[t, s]·∂(part)/∂A[t, s], read by one short backward pass per layer (from that layer's write to its own map).

These are **direct** contributions: what a head writes that the read-out sees unchanged. What it writes that later
layers read and transform (an indirect effect) is counted in those later layers' parts; head ablation measures
the total effect. Cost: it rides on the pass that captures the maps and takes the target's gradient (``reading`` is
``capture``'s graph reader): one short backward pass per layer and the head applied once per layer; the attention
biases take one pass with every map at zero, once per model.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from vit_explorer.core.attnlrp import constant_scale_norm
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import CaptureAdapter
from vit_explorer.models.layout import TokenLayout

# the parts must add up to the score within this share of the largest of them (float32 passes)
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Decomposition:
    """The target's score as the sum of what every part of the model writes into the stream it is read from.

    Attributes:
        target: the class index explained (a backbone's similarity score: 0), and ``label`` its name.
        score: the target's score (a logit, or a backbone's similarity score) as the model gives it.
        heads: each head's direct contribution ``[layers, heads]``.
        mlps: each layer's MLP's direct contribution ``[layers]``.
        attention_biases: each layer's out-projection bias (through its layer scale) ``[layers]``.
        embeddings: what entered the first layer (patch embeddings, prefix tokens, position embedding).
        readout_bias: the final norm's bias through the pooling and head, plus the head's bias.
        head_sources: each head's contribution split over the tokens it attended to ``[layers, heads, n]``
            (``head_patches`` for the patches).
        lens: the target's score read from the stream after every layer through the final norm, pooling and head
            (the logit lens) ``[layers]``; ``lens_top`` its top-5 classes there ``[layers, 5]`` (fewer for fewer classes),
            ``lens_top_scores`` their scores.
        layout: the token layout ``head_sources`` is in.
    """

    target: int
    label: str
    score: float
    heads: torch.Tensor
    mlps: torch.Tensor
    attention_biases: torch.Tensor
    embeddings: float
    readout_bias: float
    head_sources: torch.Tensor
    lens: torch.Tensor
    lens_top: torch.Tensor
    lens_top_scores: torch.Tensor
    layout: TokenLayout

    @property
    def rest(self) -> dict[str, float]:
        """The parts that are no head and no MLP, by name."""
        return {"embeddings": self.embeddings, "attention biases": float(self.attention_biases.sum()),
                "final norm and head biases": self.readout_bias}

    @property
    def total(self) -> float:
        """The parts summed: the score, to float tolerance."""
        return float(self.heads.sum() + self.mlps.sum()) + sum(self.rest.values())

    @property
    def head_patches(self) -> torch.Tensor:
        """Each head's contribution from each patch it attended to ``[layers, heads, grid_h, grid_w]``."""
        return self.layout.patch_map(self.head_sources)

    def as_dict(self, labels: list[str] | None = None) -> dict:
        """Plain values for JSON: every part, the check that they add up, the lens with its top classes (named by
        ``labels`` where given)."""
        def named(index: int) -> str | int:
            return labels[index] if labels and index < len(labels) else index

        return {"target": self.target, "target_label": self.label, "score": self.score, "parts_sum": self.total,
                "heads": self.heads.tolist(), "mlps": self.mlps.tolist(), "attention_biases": self.attention_biases.tolist(),
                "rest": self.rest, "top_parts": [{"part": name, "contribution": value} for name, value in self.top_parts()],
                "lens": self.lens.tolist(),
                "lens_top": [[{"class": named(int(index)), "score": float(score)} for index,
                              score in zip(indices, scores, strict=True)]
                             for indices, scores in zip(self.lens_top.tolist(), self.lens_top_scores.tolist(), strict=True)],
                "note": "direct contributions with the final norm's standard deviation held at the image's own; what a head "
                        "writes that later layers transform is counted in those layers' parts (head ablation measures it)"}

    def top_parts(self, count: int = 10) -> list[tuple[str, float]]:
        """The ``count`` heads and MLPs of largest absolute contribution, largest first: ("L3 H2", value), ("MLP 5", value)."""
        parts = [(f"L{layer} H{head}", float(self.heads[layer, head])) for layer, head in
                 torch.cartesian_prod(torch.arange(self.heads.shape[0]), torch.arange(self.heads.shape[1])).tolist()]
        parts += [(f"MLP {layer}", float(value)) for layer, value in enumerate(self.mlps.tolist())]
        return sorted(parts, key=lambda part: -abs(part[1]))[:count]


def first(output: object) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


@contextmanager
def recording_streams(module: nn.Module, adapter: CaptureAdapter) -> Iterator[dict]:
    """While active, the stream entering the first layer lands under "entry", each layer's attention write under
    ("write", layer) and the stream after each layer under ("after", layer), all ``[b, n, dim]`` in the graph."""
    found: dict = {}

    def entry(_module: nn.Module, inputs: tuple) -> None:
        found["entry"] = inputs[0]

    def write(layer: int, _module: nn.Module, _inputs: tuple, output: object) -> None:
        found["write", layer] = first(output)

    handles = [adapter.stream_entries(module)[0].register_forward_pre_hook(entry)]
    try:
        for layer, writer in enumerate(adapter.attention_writes(module)):
            handles.append(writer.register_forward_hook(partial(write, layer)))
        with adapter.layer_outputs(module, lambda layer, hidden: found.__setitem__(("after", layer), hidden)):
            yield found
    finally:
        for handle in handles:
            handle.remove()


def readout_slope(module: nn.Module, adapter: CaptureAdapter, last: torch.Tensor, target: int) -> torch.Tensor:
    """The read-out's slope at the last stream ``last`` ``[n, dim]`` (float64), with every norm's standard deviation held
    at its value on ``last`` (the read-out is then affine in the stream)."""
    stream = last.detach()[None].requires_grad_(True)
    handles = [norm.register_forward_hook(constant_scale_norm) for norm in adapter.layer_norms(module)]
    try:
        score = adapter.classify(module, stream)[0, target]
        (slope,) = torch.autograd.grad(score, stream)
    finally:
        for handle in handles:
            handle.remove()
    return slope[0].double()


@contextmanager
def held_norms(norms: list[nn.Module]) -> Iterator[None]:
    """While active, each of ``norms`` (LayerNorms, and a cosine's ``UnitNorm``) divides by the scale it had on the first
    input it met once this began (a LayerNorm's standard deviation per token, a unit norm's length): read the image's own
    last stream first, and the read-out is then affine in the stream, the read-out the decomposition splits. A read-out of
    zeros without it would scale a cosine's unit norm by the zero stream's length, not the image's."""
    scales: dict[nn.Module, torch.Tensor] = {}

    def held(norm: nn.Module, inputs: tuple, _output: torch.Tensor) -> torch.Tensor:
        x = inputs[0]
        layer_norm = isinstance(norm, nn.LayerNorm)
        centred = x - x.mean(dim=-1, keepdim=True) if layer_norm else x
        if norm not in scales:
            scales[norm] = ((centred.pow(2).mean(dim=-1, keepdim=True) + norm.eps).sqrt() if layer_norm
                            else x.norm(dim=-1, keepdim=True).clamp_min(norm.eps)).detach()
        result = centred / scales[norm]
        if layer_norm and norm.weight is not None:
            result = result * norm.weight
        if layer_norm and norm.bias is not None:
            result = result + norm.bias
        return result

    handles = [norm.register_forward_hook(held) for norm in norms]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


Reader = Callable[[torch.Tensor, list[torch.Tensor], int], "Decomposition | VitExplorerError"]


@contextmanager
def reading(module: nn.Module, adapter: CaptureAdapter, images: torch.Tensor) -> Iterator[Reader]:
    """``capture``'s graph reader for the decomposition: while active, the stream's parts are recorded in the graph of
    the pass, and the yielded ``read(logits, maps, target)`` decomposes image 0's score of class ``target`` from them
    (its maps ``maps`` still in the graph), giving the ``Decomposition`` or the ``VitExplorerError`` that says why this
    model cannot be decomposed (so that a pass that decomposes on the side never fails for it). Enter it before any
    capture hook: the attention biases' one pass runs here, once per model (``zero_map_writes``)."""
    try:
        adapter.attention_writes(module)
        adapter.stream_entries(module)
    except VitExplorerError as error:
        refused = error
    else:
        refused = None
    if refused is not None:
        yield lambda *_: refused
        return
    zero_writes = zero_map_writes(module, adapter, images[:1])
    layout = adapter.layout(module, tuple(images.shape[-2:]))
    with recording_streams(module, adapter) as streams:
        yield partial(read_graph, module, adapter, layout, streams, zero_writes)


def read_graph(module: nn.Module, adapter: CaptureAdapter, layout: TokenLayout, streams: dict, zero_writes: torch.Tensor,
               logits: torch.Tensor, maps: list[torch.Tensor], target: int) -> Decomposition | VitExplorerError:
    """Image 0's decomposition from a pass's recorded ``streams`` and its per-layer ``maps`` ``[b, heads, n, n]``, both in
    the graph (which it keeps): the read-out's slope, one short backward pass per layer from that layer's write to its
    map, and the lens through the head; ``zero_writes`` ``[layers, n, dim]`` are the writes with every map at zero."""
    num_layers = len(maps)
    if not 0 <= target < logits.shape[-1]:
        return VitExplorerError(f"class {target} is outside this model's {logits.shape[-1]} classes")
    slope = readout_slope(module, adapter, streams["after", num_layers - 1][0], target)

    def along(stream: torch.Tensor) -> torch.Tensor:
        return (stream.detach()[0].double() * slope).sum()

    heads, sources, writes = [], [], []
    for layer in range(num_layers):
        write = streams["write", layer]
        direct = (write[0] * slope.to(write.dtype)).sum()
        (gradient,) = torch.autograd.grad(direct, maps[layer], retain_graph=True)  # [b, heads, n, n]
        source = (maps[layer].detach()[0] * gradient[0]).sum(dim=1).double()  # [heads, n]: over queries
        sources.append(source)
        heads.append(source.sum(dim=1))
        writes.append(along(write))
    entry = streams["entry"]
    befores = [entry] + [streams["after", layer] for layer in range(num_layers - 1)]
    mlps = [along(streams["after", layer]) - along(before) - writes[layer] for layer, before in enumerate(befores)]
    with torch.no_grad():
        lens_logits = adapter.classify(module, torch.cat([streams["after", layer].detach()[:1] for layer in range(num_layers)]))
    with torch.no_grad(), held_norms(adapter.layer_norms(module)):
        adapter.classify(module, streams["after", num_layers - 1].detach()[:1])  # the image's own scales, held
        readout_bias = float(adapter.classify(module, torch.zeros_like(entry.detach()[:1]))[0, target])
    embeddings = float(along(entry))
    biases = (zero_writes.double() * slope).sum(dim=(1, 2))  # [layers]
    heads_t, writes_t = torch.stack(heads), torch.stack(writes)  # [layers, heads], [layers]
    top = lens_logits.topk(min(5, lens_logits.shape[1]), dim=1)
    decomposition = Decomposition(
        target=target, label=str(target), score=float(logits.detach()[0, target]), heads=heads_t.float(),
        mlps=torch.stack(mlps).float(), attention_biases=biases.float(), embeddings=embeddings, readout_bias=readout_bias,
        head_sources=torch.stack(sources).float(), lens=lens_logits[:, target].float(), lens_top=top.indices,
        lens_top_scores=top.values.float(), layout=layout)
    parts = torch.cat([heads_t.flatten(), torch.stack(mlps), biases,
                       torch.tensor([embeddings, readout_bias], dtype=torch.float64)])
    return (refusal(writes_t - heads_t.sum(dim=1) - biases, writes_t, "its attention is not affine in the attention map (a norm "
                    "inside it?), so a head's write is not its share of the layer's")
            or refusal(torch.tensor([decomposition.total - decomposition.score]), parts, "its read-out is not affine in the "
                       "stream once its norms' scale is held (a non-linear head?), so the parts do not add up to the score")
            or decomposition)


# what every layer's attention writes with its map at zero, by module: it depends on the weights only (a write with a zero
# map reads no stream), so one pass per model and input size serves every image and target
_zero_writes: weakref.WeakKeyDictionary[nn.Module, tuple[tuple, torch.Tensor]] = weakref.WeakKeyDictionary()


def zero_map_writes(module: nn.Module, adapter: CaptureAdapter, pixels: torch.Tensor) -> torch.Tensor:
    """Each layer's attention write with its map at zero ``[layers, n, dim]``: what the out-projection's bias (through
    any layer scale) adds whatever the heads do. One forward pass of ``pixels`` ``[1, 3, H, W]`` with every map zeroed,
    kept for the module until its weights or the input size change."""
    versions = tuple((parameter.data_ptr(), parameter._version) for parameter in module.parameters())
    key = (tuple(pixels.shape), pixels.device, versions)
    kept = _zero_writes.get(module)
    if kept is not None and kept[0] == key:
        return kept[1]
    writes: dict[int, torch.Tensor] = {}

    def keep(layer: int, _module: nn.Module, _inputs: tuple, output: object) -> None:
        writes[layer] = first(output)[0].detach()

    num_layers = adapter.map_shape(module)[0]
    handles = [writer.register_forward_hook(partial(keep, layer)) for layer,
               writer in enumerate(adapter.attention_writes(module))]
    try:
        with torch.no_grad(), adapter.edited(module, dict.fromkeys(range(num_layers), torch.zeros_like)) as forward:
            forward(pixels.detach())
    finally:
        for handle in handles:
            handle.remove()
    stacked = torch.stack([writes[layer] for layer in range(num_layers)])
    _zero_writes[module] = (key, stacked)
    return stacked


def refusal(error: torch.Tensor, parts: torch.Tensor, why: str) -> VitExplorerError | None:
    """The error that refuses the decomposition where ``error`` exceeds ``TOLERANCE`` of the largest of ``parts``."""
    scale = float(parts.abs().max()) if parts.numel() else 0.0
    if float(error.abs().max()) > TOLERANCE * max(scale, 1e-6):
        return VitExplorerError(f"this model cannot be decomposed exactly: {why} (off by {float(error.abs().max()):.3g} "
                                f"against parts up to {scale:.3g})")
    return None
