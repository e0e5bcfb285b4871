"""Activation patching between two images: run image A, replace one part of its computation with its value on image
B, and measure how A's target score moves. Two kinds of part:

- a **head's output** (its attention-weighted values, before the out-projection) at one layer: ``heads`` ``[layers,
  heads]``, which heads carry what tells the two images apart for this target;
- the **residual stream after a layer at one token**: ``tokens`` ``[layers, n]``, where in depth and space the
  difference lives. Patching every token of a layer's stream gives B's score exactly; patching nothing gives A's.

Unlike the decomposition's direct contributions, a patch counts everything that follows from it (later layers
included), so it is causal. The target is A's: a class index, or a backbone's similarity score with its reference
held fixed. Cost: one pass of B to record it, one of A, then per layer one forward pass branched at that layer into
one copy per head (as head ablation does) and, for the tokens, into one copy per token, the copies in chunks of
``CHUNK`` (``forward_passes`` counts the whole in plain forward passes of one image): on a 6-layer model of 257 tokens
about 900 passes for the tokens, so they are asked for apart from the heads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from vit_explorer.core.capture import capture_lock
from vit_explorer.core.interventions import Patching, patching_passes
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import LoadedModel

CHUNK = 64  # copies of the stream per branched pass: bounds the memory of patching every token of a large model


@dataclass(frozen=True)
class Recorded:
    """One image's parts as patching takes them: each layer's heads' outputs ``[n, heads · head_dim]``, its residual
    stream after the layer ``[n, dim]``, and the image's scores ``[classes]``."""

    head_outputs: list[torch.Tensor]
    residuals: list[torch.Tensor]
    logits: torch.Tensor


def record(model: LoadedModel, pixels: torch.Tensor) -> Recorded:
    """One pass of ``pixels`` ``[1, 3, H, W]``, keeping what patching replaces."""
    module, adapter = model.module, model.adapter
    outputs: dict[int, torch.Tensor] = {}
    residuals: dict[int, torch.Tensor] = {}

    def keep(layer: int, _module: nn.Module, inputs: tuple) -> None:
        outputs[layer] = inputs[0][0].detach().clone()

    handles = [projection.register_forward_pre_hook(partial(keep, layer))
               for layer, projection in enumerate(adapter.head_projections(module))]
    try:
        with capture_lock(module), torch.inference_mode(), adapter.layer_outputs(
                module, lambda layer, hidden: residuals.__setitem__(layer, hidden[0].detach().clone())):
            logits = adapter.logits(module, pixels.to(model.device))[0].double().cpu()
    finally:
        for handle in handles:
            handle.remove()
    layers = model.map_shape[0]
    if sorted(outputs) != list(range(layers)) or sorted(residuals) != list(range(layers)):
        raise RuntimeError(f"{type(adapter).__name__} did not reach every layer's heads and stream")
    return Recorded([outputs[layer] for layer in range(layers)], [residuals[layer] for layer in range(layers)], logits)


@contextmanager
def changing_input(hooked: nn.Module, change: Callable[[torch.Tensor], torch.Tensor], seen: list) -> Iterator[None]:
    """While active, ``hooked``'s first positional input goes through ``change`` (registered after any branch, so it sees
    the copies); ``seen`` records each call, so that a hook the forward never reached cannot pass silently."""
    def hook(_module: nn.Module, inputs: tuple) -> tuple:
        seen.append(True)
        return (change(inputs[0].clone()), *inputs[1:])

    handle = hooked.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def changing_residual(model: LoadedModel, layer: int, change: Callable[[torch.Tensor], torch.Tensor],
                      seen: list) -> Iterator[None]:
    """While active, the residual stream after ``layer`` goes through ``change`` (``CaptureAdapter.with_residual``)."""
    adapter = model.adapter

    def hook(_module: nn.Module, inputs: tuple, output: object) -> object:
        seen.append(True)
        return adapter.with_residual(inputs, output, change(adapter.residual_after(inputs, output).clone()))

    handle = adapter.residual_modules(model.module)[layer].register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def run_copies(model: LoadedModel, pixels: torch.Tensor, layer: int, copies: int, changed: Callable[[list], object],
               target: int) -> torch.Tensor:
    """The target's score ``[copies]`` of one pass of ``pixels`` branched at ``layer`` into ``copies`` streams, with the
    change that ``changed(seen)`` (a context manager) puts in place for all copies at once."""
    module, adapter = model.module, model.adapter
    seen: list = []
    with capture_lock(module), torch.inference_mode(), adapter.branched(module, layer, copies), changed(seen):
        logits = adapter.logits(module, pixels.to(model.device))
    if not seen or logits.shape[0] != copies:
        raise RuntimeError(f"{type(adapter).__name__} did not run the patched copies of layer {layer}")
    return logits[:, target].double().cpu()


def patched_heads(model: LoadedModel, pixels: torch.Tensor, source: Recorded, layer: int, masks: torch.Tensor,
                  target: int) -> torch.Tensor:
    """The target's score ``[copies]`` with, in copy i, the heads where ``masks[i]`` ``[copies, heads]`` is set taking
    their output at ``layer`` from ``source``."""
    heads = model.map_shape[1]
    projection = model.adapter.head_projections(model.module)[layer]
    replacement = source.head_outputs[layer]  # [n, heads · head_dim]
    width = replacement.shape[-1] // heads
    # which channels of the concatenated heads each copy takes from the source [copies, 1, heads · head_dim]
    channels = masks.repeat_interleave(width, dim=1)[:, None, :].to(replacement.device)

    def change(inputs: torch.Tensor) -> torch.Tensor:
        return torch.where(channels, replacement.to(inputs.dtype), inputs)

    return run_copies(model, pixels, layer, masks.shape[0], partial(changing_input, projection, change), target)


def patched_residual(model: LoadedModel, pixels: torch.Tensor, source: Recorded, layer: int, masks: torch.Tensor,
                     target: int) -> torch.Tensor:
    """The target's score ``[copies]`` with, in copy i, the tokens where ``masks[i]`` ``[copies, n]`` is set taking the
    residual stream after ``layer`` from ``source``."""
    replacement = source.residuals[layer]  # [n, dim]
    chosen = masks[:, :, None].to(replacement.device)  # [copies, n, 1]

    def change(stream: torch.Tensor) -> torch.Tensor:
        return torch.where(chosen, replacement.to(stream.dtype), stream)

    return run_copies(model, pixels, layer, masks.shape[0], partial(changing_residual, model, layer, change), target)


def one_hot_chunks(count: int) -> Iterator[torch.Tensor]:
    """The rows of the ``count`` × ``count`` identity, ``CHUNK`` at a time: copy i patches part i alone."""
    identity = torch.eye(count, dtype=torch.bool)
    yield from identity.split(CHUNK)


def patch(model: LoadedModel, pixels_a: torch.Tensor, pixels_b: torch.Tensor, target: int, label: str | None = None,
          tokens: bool = True, step: Callable[[], None] | None = None) -> Patching:
    """Patch B into A, each head of each layer and (with ``tokens``) each token of each layer's stream, for A's
    ``target``; ``step`` is called after each layer's heads and each layer's tokens."""
    for pixels in (pixels_a, pixels_b):
        if pixels.ndim != 4 or pixels.shape[0] != 1:
            raise VitExplorerError(f"patching takes one image on each side, pixels [1, 3, H, W], not {list(pixels.shape)}")
    if pixels_a.shape != pixels_b.shape:
        raise VitExplorerError(f"A and B must reach the model at one size to patch one into the other: {list(pixels_a.shape)} "
                               f"and {list(pixels_b.shape)}")
    layers, heads = model.map_shape
    if not 0 <= target < model.num_classes:
        raise VitExplorerError(f"class {target} is outside this model's {model.num_classes} classes")
    source = record(model, pixels_b)
    score_a, score_b = float(model.logits(pixels_a)[0, target]), float(source.logits[target])
    head_rows = []
    for layer in range(layers):
        head_rows.append(patched_heads(model, pixels_a, source, layer, torch.eye(heads, dtype=torch.bool), target) - score_a)
        if step is not None:
            step()
    token_rows = None
    if tokens:
        count = model.layout.num_tokens
        token_rows = []
        for layer in range(layers):
            token_rows.append(torch.cat([patched_residual(model, pixels_a, source, layer, masks, target)
                                         for masks in one_hot_chunks(count)]) - score_a)
            if step is not None:
                step()
    return Patching(target=target, label=label or str(target), score_a=score_a, score_b=score_b,
                    heads=torch.stack(head_rows).float(),
                    tokens=None if token_rows is None else torch.stack(token_rows).float(),
                    forward_passes=patching_passes(*model.map_shape, model.layout.num_tokens, tokens),
                    layout=model.layout)
