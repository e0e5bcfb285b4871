"""One forward pass with the attention of every layer captured: ``record_attention``."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, MutableMapping
from contextlib import ExitStack
from types import TracebackType

import torch
from torch import nn

from .errors import VitExplorerError
from .models import adapter_for
from .models.base import CaptureAdapter, LoadedModel

# Hooks live on the module, so two threads capturing from one module at once would each record the
# other's maps: one lock per module (weakly held, so it goes with the module) serialises capture.
_module_locks: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_module_locks_guard = threading.Lock()


def capture_lock(module: nn.Module) -> threading.RLock:
    with _module_locks_guard:
        return _module_locks.setdefault(module, threading.RLock())


def resolve(model: nn.Module | LoadedModel, adapter: CaptureAdapter | None = None) -> tuple[nn.Module, CaptureAdapter]:
    """The module to run and the adapter that knows where its attention appears."""
    module = model.module if isinstance(model, LoadedModel) else model
    if adapter is None:
        adapter = model.adapter if isinstance(model, LoadedModel) else adapter_for(module)
    return module, adapter


def check_captured(sink: MutableMapping[int, object], module: nn.Module, adapter: CaptureAdapter) -> None:
    if not len(sink):
        raise RuntimeError(
            f"{type(adapter).__name__} captured no attention maps from {type(module).__name__}: "
            "its attention does not run through the hooked modules"
        )


def capture_into(model: nn.Module | LoadedModel, images: torch.Tensor, sink: MutableMapping[int, torch.Tensor]) -> torch.Tensor:
    """One no-grad forward pass in which each layer's map ``[b, heads, n, n]`` goes to ``sink[layer] = map``.

    For sinks that reduce each map as it arrives (to float16, to a few rows, to statistics), so the
    full float32 stack of a large model is never held at once. Returns the logits.
    """
    module, adapter = resolve(model)
    with capture_lock(module), adapter.attached(module, sink) as forward, torch.inference_mode():
        logits = forward(images)
    check_captured(sink, module, adapter)
    return logits


class LayerSink(MutableMapping):
    """Where an adapter puts each layer's map (``sink[layer] = map``); subclasses decide what of it to
    keep in ``self.layers`` as it arrives, so a large model's full float32 stack need never be held."""

    def __init__(self) -> None:
        self.layers: dict[int, object] = {}

    def __setitem__(self, layer: int, attention: torch.Tensor) -> None:
        self.layers[layer] = attention

    def __getitem__(self, layer: int) -> object:
        return self.layers[layer]

    def __delitem__(self, layer: int) -> None:
        del self.layers[layer]

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.layers))

    def __len__(self) -> int:
        return len(self.layers)

    def in_layer_order(self) -> list:
        return [self.layers[layer] for layer in range(len(self.layers))]


class StackingSink(LayerSink):
    """Copies each layer's map into one ``[b, layers, heads, n, n]`` tensor as it arrives, so the
    per-layer maps are freed at once instead of all being held until a final stack.

    With ``reuse``, the tensor outlives ``clear`` and the next pass of the same shape writes into it:
    a fresh tensor of tens of MB costs a page fault per 4 KiB on first write, which is most of
    what capture adds to a forward pass (see the README's figures).
    """

    def __init__(self, num_layers: int, reuse: bool = False) -> None:
        super().__init__()
        self.num_layers = num_layers
        self.reuse = reuse
        self.stacked: torch.Tensor | None = None

    def __setitem__(self, layer: int, attention: torch.Tensor) -> None:
        shape = (attention.shape[0], self.num_layers, *attention.shape[1:])
        fits = (self.stacked is not None and self.stacked.shape == shape and self.stacked.dtype == attention.dtype
                and self.stacked.device == attention.device)
        if not fits:
            self.stacked = attention.new_empty(shape)
        self.stacked[:, layer] = attention
        self.layers[layer] = self.stacked[:, layer]

    def clear(self) -> None:
        self.layers = {}
        if not self.reuse:
            self.stacked = None


class AttentionRecorder:
    """Context manager that keeps capture attached for repeated forward passes.

    ``with AttentionRecorder(model) as record: logits, attentions = record(images)`` — hooks (and
    any fused-attention switch) are in place inside the block only and are undone on exit, also when
    a forward pass raises. Outside ``keep_graph`` the passes run under ``torch.inference_mode``.

    ``reuse_output=True`` (for loops over batches that consume each batch's maps before the next):
    every call returns the same attentions tensor, overwritten by the next call of the same shape,
    which saves allocating and first-touching it each time.
    """

    def __init__(self, model: nn.Module | LoadedModel, *, adapter: CaptureAdapter | None = None, keep_graph: bool = False,
                 reuse_output: bool = False) -> None:
        if keep_graph and reuse_output:
            raise ValueError("reuse_output cannot be combined with keep_graph: the graph holds each layer's own map")
        self.module, self.adapter = resolve(model, adapter)
        self.keep_graph = keep_graph
        self.num_layers = self.adapter.map_shape(self.module)[0]
        self._sink: LayerSink = LayerSink() if keep_graph else StackingSink(self.num_layers, reuse=reuse_output)
        self._stack: ExitStack | None = None
        self._forward = None

    def __enter__(self) -> AttentionRecorder:
        self._stack = ExitStack()
        self._stack.enter_context(capture_lock(self.module))
        try:
            self._forward = self._stack.enter_context(self.adapter.attached(self.module, self._sink))
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        assert self._stack is not None
        self._forward = None
        self._sink.clear()
        if isinstance(self._sink, StackingSink):
            self._sink.stacked = None  # the reused tensor stays with the caller, not with the recorder
        self._stack.close()

    def __call__(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pixels ``[b, 3, H, W]`` → logits ``[b, classes]`` and attentions ``[b, layers, heads, n, n]``."""
        if self._forward is None:
            raise RuntimeError("AttentionRecorder is called outside its `with` block")
        self._sink.clear()
        try:
            if self.keep_graph:
                logits = self._forward(images)
            else:
                with torch.inference_mode():
                    logits = self._forward(images)
            check_captured(self._sink, self.module, self.adapter)
            layers = sorted(self._sink)
            assert layers == list(range(self.num_layers)), f"captured layers {layers} are not 0…{self.num_layers - 1}"
            if self.keep_graph:  # the per-layer maps are the ones in the graph: stack them
                attentions = torch.stack(self._sink.in_layer_order(), dim=1)
            else:
                attentions = self._sink.stacked  # [b, layers, heads, n, n]
        finally:
            self._sink.clear()
        return logits, attentions


def record_attention_gradients(
    model: nn.Module | LoadedModel, images: torch.Tensor, targets: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward and one backward pass: the maps of every layer and their gradients for a class.

    ``targets`` ``[b]`` are class indices (default: each image's top prediction). Returns logits
    ``[b, classes]``, attentions and ∂ logit[target] / ∂ attention, both ``[b, layers, heads, n, n]``
    and detached. The gradient is taken with respect to the per-layer maps the forward pass used, so
    it is the one the class score really has; the no-grad capture above is not involved.
    """
    module, adapter = resolve(model)
    sink = LayerSink()
    with capture_lock(module), adapter.attached(module, sink) as forward, torch.enable_grad():
        # the input requires grad so that the maps are in the graph even when the weights are frozen
        logits = forward(images.detach().requires_grad_(True))
        check_captured(sink, module, adapter)
        if logits.shape[-1] == 0:
            raise VitExplorerError("this model has no classifier head, so it has no class score to take gradients of")
        if targets is None:
            targets = logits.argmax(dim=-1)
        maps = sink.in_layer_order()
        # each image's score depends on its own maps only, so the gradient of the sum is per image
        score = logits.gather(1, targets.to(logits.device).view(-1, 1)).sum()
        gradients = torch.autograd.grad(score, maps)
    return logits.detach(), torch.stack([layer.detach() for layer in maps], dim=1), torch.stack(gradients, dim=1)


def record_attention(
    model: nn.Module | LoadedModel, images: torch.Tensor, *, adapter: CaptureAdapter | None = None, keep_graph: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``model`` once on ``images`` ``[b, 3, H, W]`` and capture softmax(q·kᵀ/√d) of every layer.

    Returns logits ``[b, classes]`` and attentions ``[b, layers, heads, n, n]`` in layer order, each row
    a probability distribution over the n keys. Hooks are removed before this returns or raises.
    ``keep_graph=True`` keeps the maps in the autograd graph (for gradient-based maps).
    """
    with AttentionRecorder(model, adapter=adapter, keep_graph=keep_graph) as record:
        return record(images)
