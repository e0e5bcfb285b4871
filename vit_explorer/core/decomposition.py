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
the total effect. Cost: one forward pass with the maps in the graph, one short backward per layer, and one forward
pass with every map set to zero (each layer's attention biases, read without the heads).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from vit_explorer.core.attnlrp import constant_scale_norm
from vit_explorer.core.capture import LayerSink, capture_lock, resolve
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import CaptureAdapter, LoadedModel
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
                "lens_top": [[{"class": named(int(index)), "score": float(score)} for index, score in zip(indices, scores)]
                             for indices, scores in zip(self.lens_top.tolist(), self.lens_top_scores.tolist())],
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


def readout_slope(module: nn.Module, adapter: CaptureAdapter, last: torch.Tensor, target: int) -> tuple[float, torch.Tensor]:
    """The score read from the last stream ``last`` ``[n, dim]`` and the read-out's slope there ``[n, dim]`` (float64), with
    every norm's standard deviation held at its value on ``last`` (the read-out is then affine in the stream)."""
    stream = last.detach()[None].requires_grad_(True)
    handles = [norm.register_forward_hook(constant_scale_norm) for norm in adapter.layer_norms(module)]
    try:
        score = adapter.classify(module, stream)[0, target]
        (slope,) = torch.autograd.grad(score, stream)
    finally:
        for handle in handles:
            handle.remove()
    return float(score.detach()), slope[0].double()


def decompose_pixels(model: LoadedModel, pixels: torch.Tensor, target: int, label: str | None = None) -> Decomposition:
    """The decomposition of class ``target``'s score (a backbone's similarity model: 0) for one image ``pixels``
    ``[1, 3, H, W]``. Refuses a model whose parts do not add up to its score (a read-out that is not affine once its
    norms' scale is held, an attention that is not affine in its map)."""
    module, adapter = resolve(model)
    num_layers = model.map_shape[0]
    if not 0 <= target < model.num_classes:
        raise VitExplorerError(f"class {target} is outside this model's {model.num_classes} classes")
    maps = LayerSink()
    with (capture_lock(module), torch.enable_grad(), recording_streams(module, adapter) as streams,
          adapter.attached(module, maps) as forward):
        logits = forward(pixels.detach().to(model.device))
        _, slope = readout_slope(module, adapter, streams["after", num_layers - 1][0], target)

        def along(stream: torch.Tensor) -> torch.Tensor:
            return (stream.detach()[0].double() * slope).sum()

        heads, sources, writes = [], [], []
        for layer in range(num_layers):
            write = streams["write", layer]
            direct = (write[0] * slope.to(write.dtype)).sum()
            (gradient,) = torch.autograd.grad(direct, maps[layer], retain_graph=True)  # [1, heads, n, n]
            source = (maps[layer].detach()[0].double() * gradient[0].double()).sum(dim=1)  # [heads, n]: over queries
            sources.append(source)
            heads.append(source.sum(dim=1))
            writes.append(along(write))
        entry = streams["entry"]
        befores = [entry] + [streams["after", layer] for layer in range(num_layers - 1)]
        mlps = [along(streams["after", layer]) - along(before) - writes[layer] for layer, before in enumerate(befores)]
        with torch.no_grad():
            lens_logits = torch.stack([adapter.classify(module, streams["after", layer].detach())[0] for layer in range(num_layers)])
        embeddings = float(along(entry))
        del streams, maps
    with capture_lock(module), torch.no_grad():
        readout_bias = float(adapter.classify(module, torch.zeros_like(entry.detach()))[0, target])
        biases = attention_biases(module, adapter, pixels.to(model.device), slope, num_layers)
    heads_t, writes_t = torch.stack(heads), torch.stack(writes)  # [layers, heads], [layers]
    check(writes_t - heads_t.sum(dim=1) - biases, writes_t, "its attention is not affine in the attention map (a norm inside "
          "it?), so a head's write is not its share of the layer's")
    decomposition = Decomposition(
        target=target, label=label or str(target), score=float(logits.detach()[0, target]), heads=heads_t.float(), mlps=torch.stack(mlps).float(),
        attention_biases=biases.float(), embeddings=embeddings, readout_bias=readout_bias,
        head_sources=torch.stack(sources).float(), lens=lens_logits[:, target].float(),
        lens_top=lens_logits.topk(min(5, lens_logits.shape[1]), dim=1).indices,
        lens_top_scores=lens_logits.topk(min(5, lens_logits.shape[1]), dim=1).values.float(), layout=model.layout)
    parts = torch.cat([heads_t.flatten(), torch.stack(mlps), biases, torch.tensor([embeddings, readout_bias], dtype=torch.float64)])
    check(torch.tensor([decomposition.total - decomposition.score]), parts, "its read-out is not affine in the stream once its "
          "norms' scale is held (a non-linear head?), so the parts do not add up to the score")
    return decomposition


def attention_biases(module: nn.Module, adapter: CaptureAdapter, pixels: torch.Tensor, slope: torch.Tensor, num_layers: int) -> torch.Tensor:
    """Each layer's attention write with its map at zero, along the read-out's slope ``[layers]`` (float64): what the
    out-projection's bias adds whatever the heads do. One forward pass with every map zeroed (a write with a zero map
    depends on no stream, so one pass gives every layer's)."""
    writes: dict[int, torch.Tensor] = {}

    def keep(layer: int, _module: nn.Module, _inputs: tuple, output: object) -> None:
        writes[layer] = first(output)

    handles = [writer.register_forward_hook(partial(keep, layer)) for layer, writer in enumerate(adapter.attention_writes(module))]
    try:
        with adapter.edited(module, dict.fromkeys(range(num_layers), torch.zeros_like)) as forward:
            forward(pixels)
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack([(writes[layer][0].double() * slope).sum() for layer in range(num_layers)])


def check(error: torch.Tensor, parts: torch.Tensor, why: str) -> None:
    scale = float(parts.abs().max()) if parts.numel() else 0.0
    if float(error.abs().max()) > TOLERANCE * max(scale, 1e-6):
        raise VitExplorerError(f"this model cannot be decomposed exactly: {why} (off by {float(error.abs().max()):.3g} "
                               f"against parts up to {scale:.3g})")
