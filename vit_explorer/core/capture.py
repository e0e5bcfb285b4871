"""One forward pass (and, on request, one backward pass) with the attention of every layer captured.

``capture`` is the one call: it runs the model once with hooks on every attention softmax and hands
each layer's map ``[b, heads, n, n]`` to a *sink* that decides, as the map arrives, what of it to
keep — the full stack in float32 or float16 (``StackingSink``), a reduction made as each layer arrives (``ReducingSink``),
one query's rows (``RowSink``) — so that a large model's full stack need never be held. Given an ``InputsSink``, the pass is
the model's own fused forward instead, and what reaches the sink is each layer's queries and keys
(``CaptureAdapter.recorded_inputs``), from which ``map_store.DerivedMaps`` derives any map later. Asked for a
target class, it also takes ∂ logit[target] / ∂ A on the per-layer maps the forward used and reduces
them layer by layer. ``record_attention``, ``record_attention_gradients`` and ``AttentionRecorder``
are the batch conveniences built on the same pieces.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import torch
from torch import nn

from vit_explorer.core.map_store import QueriesKeys, input_statistics
from vit_explorer.errors import VitExplorerError
from vit_explorer.models import adapter_for
from vit_explorer.models.attention_inputs import AttentionInputs
from vit_explorer.models.base import CaptureAdapter, LoadedModel
from vit_explorer.models.layout import TokenLayout

# Hooks live on the module, so two threads capturing from one module at once would each record the
# other's maps: one lock per module (weakly held, so it goes with the module) serialises capture.
_module_locks: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_module_locks_guard = threading.Lock()

TOP = "top"  # target: each image's own top prediction

# What ``capture`` can read off the graph of its pass besides the maps' gradients: given (module, adapter, images), a
# context entered before capture's hooks (to record what it needs during the forward) that yields
# read(logits, maps, target), called with the per-layer maps still in the graph and image 0's target class.
GraphReader = Callable[[nn.Module, CaptureAdapter, torch.Tensor],
                       AbstractContextManager[Callable[[torch.Tensor, list[torch.Tensor], int], Any]]]


def capture_lock(module: nn.Module) -> threading.RLock:
    with _module_locks_guard:
        return _module_locks.setdefault(module, threading.RLock())


def resolve(model: nn.Module | LoadedModel, adapter: CaptureAdapter | None = None) -> tuple[nn.Module, CaptureAdapter]:
    """The module to run and the adapter that knows where its attention appears."""
    module = model.module if isinstance(model, LoadedModel) else model
    if adapter is None:
        adapter = model.adapter if isinstance(model, LoadedModel) else adapter_for(module)
    return module, adapter


def check_captured(sink: Mapping[int, object], module: nn.Module, adapter: CaptureAdapter) -> None:
    if not len(sink):
        raise RuntimeError(
            f"{type(adapter).__name__} captured no attention maps from {type(module).__name__}: "
            "its attention does not run through the hooked modules"
        )


# ---- sinks: what of each layer's map is kept as it arrives ---------------------------------------


class LayerSink(MutableMapping):
    """Where an adapter puts each layer's map (``sink[layer] = map``). This base keeps each layer's own
    tensor (so maps in the autograd graph stay there); subclasses keep less, and ``result`` gives what
    was kept in layer order."""

    def __init__(self) -> None:
        self.layers: dict[int, Any] = {}

    def __setitem__(self, layer: int, attention: torch.Tensor) -> None:
        self.layers[layer] = attention

    def slot(self, layer: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """Where layer ``layer``'s map ``[b, heads, n, n]`` could be written to be kept without a copy; None for a sink
        that keeps no whole map (an adapter then hands the map over as usual)."""
        return None

    def __getitem__(self, layer: int) -> Any:
        return self.layers[layer]

    def __delitem__(self, layer: int) -> None:
        del self.layers[layer]

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.layers))

    def __len__(self) -> int:
        return len(self.layers)

    def in_layer_order(self) -> list:
        return [self.layers[layer] for layer in range(len(self.layers))]

    def result(self) -> Any:
        """The per-layer tensors stacked ``[b, layers, heads, n, n]``."""
        return torch.stack(self.in_layer_order(), dim=1)


class StackingSink(LayerSink):
    """Copies each layer's map, in ``dtype`` (default: as it comes), into one ``[b, layers, heads, n, n]``
    tensor as it arrives, so the per-layer maps are freed at once instead of all being held until a
    final stack.

    With ``reuse``, the tensor outlives ``clear`` and the next pass of the same shape writes into it:
    a fresh tensor of tens of MB costs a page fault per 4 KiB on first write, which is most of
    what capture adds to a forward pass (see the README's figures).
    """

    def __init__(self, num_layers: int, dtype: torch.dtype | None = None, reuse: bool = False) -> None:
        super().__init__()
        self.num_layers = num_layers
        self.dtype = dtype
        self.reuse = reuse
        self.stacked: torch.Tensor | None = None

    def __setitem__(self, layer: int, attention: torch.Tensor) -> None:
        place = self.slot(layer, tuple(attention.shape), self.dtype or attention.dtype, attention.device)
        if place.data_ptr() != attention.data_ptr():  # else written in place already (``slot``)
            place.copy_(attention)
        self.layers[layer] = place

    def slot(self, layer: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The layer's place in the stack, for a map ``[b, heads, n, n]`` of ``dtype`` (the stack is made for it, or made
        again for another shape). An adapter that computes the softmax straight into it saves the copy of every map:
        for DINOv2 at 518 px (540 MB of maps) a third of the capture's time on 2 cores."""
        stacked_shape = (shape[0], self.num_layers, *shape[1:])
        dtype = self.dtype or dtype
        stacked = self.stacked
        if stacked is None or stacked.shape != stacked_shape or stacked.dtype != dtype or stacked.device != device:
            self.stacked = torch.empty(stacked_shape, dtype=dtype, device=device)
        return self.stacked[:, layer]

    def clear(self) -> None:
        self.layers = {}
        if not self.reuse:
            self.stacked = None

    def result(self) -> torch.Tensor:
        return self.stacked


class ReducingSink(LayerSink):
    """Reduces image 0's map of each layer ``[heads, n, n]`` with ``reduce_layer`` as it arrives, then drops the map;
    ``result`` is ``combine`` of the reductions in layer order. How the compact form is kept (``map_store``)."""

    def __init__(self, reduce_layer: Callable[[torch.Tensor], Any], combine: Callable[[list[Any]], Any]) -> None:
        super().__init__()
        self.reduce_layer = reduce_layer
        self.combine = combine

    def __setitem__(self, layer: int, attention: torch.Tensor) -> None:
        self.layers[layer] = self.reduce_layer(attention[0])

    def result(self) -> Any:
        return self.combine(self.in_layer_order())


class StatisticsSink(LayerSink):
    """Reduces every image's map of each layer to per-head ``statistics`` (a function of ``[b, heads, n, n]``
    and the layout giving ``{name: [b, heads]}``) and drops it: a batch of a dataset never holds more than
    one layer's maps."""

    def __init__(self, layout: TokenLayout,
                 statistics: Callable[[torch.Tensor, TokenLayout], Mapping[str, torch.Tensor]]) -> None:
        super().__init__()
        self.layout = layout
        self.statistics = statistics

    def __setitem__(self, layer: int, attention: torch.Tensor) -> None:
        # [b, heads, n, n], this layer only, reduced where it is (CPU or GPU)
        self.keep(layer, self.statistics(attention.detach(), self.layout))

    def keep(self, layer: int, values: Mapping[str, torch.Tensor]) -> None:
        self.layers[layer] = {name: value.float().cpu() for name, value in values.items()}

    def result(self) -> dict[str, torch.Tensor]:
        """``{name: [b, layers, heads]}`` float32 CPU tensors, like every other sink's."""
        layers = self.in_layer_order()
        return {name: torch.stack([layer[name] for layer in layers], dim=1) for name in layers[0]}


class InputsSink(LayerSink):
    """Keeps each layer's attention inputs (``AttentionInputs``) instead of its map: the sink of a pass on the model's
    fused path (``CaptureAdapter.recorded_inputs``), whose maps are derived later (``map_store.DerivedMaps``). Queries and
    keys are copied as each layer arrives into one CPU stack each ``[b, layers, heads, n, d]`` in ``dtype``, so that no
    layer's copy is held beside the stack."""

    reads_inputs = True

    def __init__(self, num_layers: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.num_layers = num_layers
        self.dtype = dtype
        self.queries: torch.Tensor | None = None
        self.keys: torch.Tensor | None = None

    def __setitem__(self, layer: int, inputs: AttentionInputs) -> None:
        if self.queries is None:
            shape = (inputs.queries.shape[0], self.num_layers, *inputs.queries.shape[1:])
            self.queries, self.keys = (torch.empty(shape, dtype=self.dtype) for _ in range(2))
        self.queries[:, layer].copy_(inputs.queries.detach())
        self.keys[:, layer].copy_(inputs.keys.detach())
        # the bias stays float32, since its ``-inf`` and its small differences are what it says
        self.layers[layer] = None if inputs.bias is None else inputs.bias.detach().to("cpu", torch.float32)

    def result(self) -> list[QueriesKeys]:
        """Each image's ``QueriesKeys``."""
        biases = self.in_layer_order()
        images = len(self.queries)

        def bias_of(bias: torch.Tensor | None, image: int) -> torch.Tensor | None:
            if bias is None:
                return None
            bias = bias.expand(images, *bias.shape[1:]) if bias.ndim == 4 else bias[None]
            return bias[image].contiguous()  # broadcastable to [heads, n, n]

        return [QueriesKeys(self.queries[image], self.keys[image], tuple(bias_of(bias, image) for bias in biases))
                for image in range(images)]


class InputStatisticsSink(StatisticsSink):
    """``StatisticsSink`` on the model's fused path: each layer's statistics derived from its queries and keys in blocks of
    rows as the layer arrives (``map_store.input_statistics``), so that a batch never holds an n × n map."""

    reads_inputs = True

    def __init__(self, layout: TokenLayout) -> None:
        super().__init__(layout, input_statistics)

    def __setitem__(self, layer: int, inputs: AttentionInputs) -> None:
        self.keep(layer, self.statistics(inputs, self.layout))


class RowSink(LayerSink):
    """Keeps only token ``query``'s row of every head of image 0 ``[heads, n]`` per layer."""

    def __init__(self, query: int) -> None:
        super().__init__()
        self.query = query

    def __setitem__(self, layer: int, attention: torch.Tensor) -> None:
        self.layers[layer] = attention[0, :, self.query, :].to(torch.float32)

    def result(self) -> torch.Tensor:
        """``[layers, heads, n]`` float32, on the CPU."""
        return torch.stack(self.in_layer_order()).cpu()


# ---- the one call ------------------------------------------------------------------------------


LAST = "last"  # where ``recording_norms`` keeps the last layer's stream
LAYER_TOKENS = "layer tokens"  # where it keeps every layer's tokens through the final norm ``[b, layers, n, dim]``


@contextmanager
def recording_norms(module: nn.Module, adapter: CaptureAdapter, active: bool) -> Iterator[dict]:
    """While active, the L2 norm of every token of the residual stream after each layer ``[b, n]`` (float32,
    detached) lands in the yielded dict by layer, the last layer's stream itself ``[b, n, dim]`` under the key
    ``LAST`` (for the output tokens), and each layer's tokens through the model's final norm (float16, as DINOv2's
    intermediate features are read) written into one CPU stack ``[b, layers, n, dim]`` under ``LAYER_TOKENS`` as the
    layer passes, so that no layer's copy is held beside it. No other hidden state is held past its layer."""
    norms: dict = {}
    if not active:
        yield norms
        return
    num_layers = adapter.map_shape(module)[0]

    def record(layer: int, hidden: torch.Tensor) -> None:
        hidden = hidden.detach()
        norms[layer] = torch.linalg.vector_norm(hidden, dim=-1, dtype=torch.float32)
        if layer >= norms.get(LAST, (-1, None))[0]:
            norms[LAST] = (layer, hidden)
        if LAYER_TOKENS not in norms:
            norms[LAYER_TOKENS] = torch.empty(hidden.shape[0], num_layers, *hidden.shape[1:], dtype=torch.float16)
        with torch.no_grad():
            norms[LAYER_TOKENS][:, layer].copy_(adapter.final_tokens(module, hidden))

    with adapter.layer_outputs(module, record):
        yield norms


def read_norms(recorded: dict, module: nn.Module, adapter: CaptureAdapter) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What ``recording_norms`` recorded through one pass, as ``Captured`` holds it: the token norms ``[b, layers, n]``,
    the output tokens ``[b, n, dim]`` (float32) and every layer's tokens ``[b, layers, n, dim]`` (float16), on the CPU."""
    _, last = recorded.pop(LAST)
    layer_tokens = recorded.pop(LAYER_TOKENS)
    with torch.no_grad():
        output_tokens = adapter.final_tokens(module, last).float().cpu()
    return torch.stack([recorded[layer] for layer in range(len(recorded))], dim=1).cpu(), output_tokens, layer_tokens


@dataclass
class Captured:
    """What one ``capture`` call returns.

    Attributes:
        logits: ``[b, classes]`` (``[b, 0]`` for a backbone), detached.
        kept: what the sink kept (``LayerSink.result``), or None when no sink was given.
        targets: the class of each image the gradients are for ``[b]``; None without gradients.
        gradients: per layer, what ``reduce_gradients`` made of (map, ∂ logit[target] / ∂ map), or the
            gradients stacked ``[b, layers, heads, n, n]`` without a reducer; None when not asked for
            (or when a backbone has no class for a ``TOP`` target).
        token_norms: the L2 norm of every token of the residual stream after each layer ``[b, layers, n]``
            (float32, on the CPU) when asked for, else None.
        output_tokens: with the norms, every token as the model outputs it (after its final norm) ``[b, n, dim]``
            (float32, on the CPU), else None.
        layer_tokens: with the norms, every token after each layer through the final norm ``[b, layers, n, dim]``
            (float16, on the CPU), else None.
        reading: what the graph reader read for image 0 (``decomposition.reading``: its decomposition), else None.
    """

    logits: torch.Tensor
    kept: Any
    targets: torch.Tensor | None = None
    gradients: Any = None
    token_norms: torch.Tensor | None = None
    output_tokens: torch.Tensor | None = None
    layer_tokens: torch.Tensor | None = None
    reading: Any = None


def capture(
    model: nn.Module | LoadedModel,
    images: torch.Tensor,
    sink: LayerSink | None = None,
    *,
    target: str | int | torch.Tensor | None = None,
    reduce_gradients: Callable[[torch.Tensor, torch.Tensor], Any] | None = None,
    norms: bool = False,
    graph_reader: GraphReader | None = None,
) -> Captured:
    """Run ``model`` once on ``images`` ``[b, 3, H, W]`` with every layer's softmax(q·kᵀ/√d) going to ``sink``.

    Without ``target`` the pass runs under ``torch.inference_mode``. With one (``TOP``, a class index,
    or indices ``[b]``), one backward pass gives ∂ logit[target] / ∂ A on the per-layer maps the forward
    used (the input requires grad, so frozen weights still put the maps in the graph); the maps reach
    the sink after it, detached. ``norms`` also records the token norms after every layer
    (``recording_norms``). With a target, ``graph_reader`` reads image 0's graph before the backward pass frees it
    (``GraphReader``; its result is ``reading``). Hooks are removed before this returns or raises.
    """
    module, adapter = resolve(model)
    reads_inputs = getattr(sink, "reads_inputs", False)
    if reads_inputs and target is not None:
        raise ValueError("a pass that records attention inputs runs the fused path, which has no maps to differentiate")
    graph = LayerSink() if target is not None else None
    hooked = graph if graph is not None else (sink if sink is not None else LayerSink())
    targets = gradients = reading = None
    reader = graph_reader(module, adapter, images) if graph_reader is not None and graph is not None else nullcontext()
    attach = adapter.recorded_inputs(module, hooked.__setitem__) if reads_inputs else adapter.attached(module, hooked)
    with (capture_lock(module), reader as read, recording_norms(module, adapter, norms) as layer_norms, attach as forward):
        if graph is None:
            with torch.inference_mode():
                logits = forward(images)
            check_captured(hooked, module, adapter)
        else:
            with torch.enable_grad():
                logits = forward(images.detach().requires_grad_(True))
                check_captured(graph, module, adapter)
                maps = graph.in_layer_order()
                targets = class_targets(logits, target)
                if targets is not None:
                    if read is not None:
                        reading = read(logits, maps, int(targets[0]))
                    # each image's score depends on its own maps only, so the gradient of the sum is per image
                    score = logits.gather(1, targets.view(-1, 1)).sum()
                    layer_gradients = torch.autograd.grad(score, maps)
            if sink is not None:
                for layer, attention in enumerate(maps):
                    sink[layer] = attention.detach()
            if targets is not None:
                if reduce_gradients is None:
                    gradients = torch.stack(layer_gradients, dim=1)
                else:
                    gradients = [reduce_gradients(attention.detach(), gradient) for attention,
                                 gradient in zip(maps, layer_gradients, strict=True)]
            del maps, graph
    token_norms, output_tokens, layer_tokens = read_norms(layer_norms, module, adapter) if norms else (None, None, None)
    return Captured(logits=logits.detach(), kept=sink.result() if sink is not None else None, targets=targets,
                    gradients=gradients,
                    token_norms=token_norms, output_tokens=output_tokens, layer_tokens=layer_tokens, reading=reading)


def class_targets(logits: torch.Tensor, target: str | int | torch.Tensor) -> torch.Tensor | None:
    """The class index of each image ``[b]`` for ``target`` (indices below 0: that image's top class); None
    for ``TOP`` on a backbone without classes."""
    if logits.shape[-1] == 0:
        if isinstance(target, str) and target == TOP:
            return None
        raise VitExplorerError("this model has no classifier head, so it has no class score to take gradients of")
    if isinstance(target, str):
        if target != TOP:
            raise ValueError(f"target must be {TOP!r}, a class index or indices, not {target!r}")
        return logits.detach().argmax(dim=-1)
    indices = torch.as_tensor(target, device=logits.device).reshape(-1).expand(logits.shape[0])
    return torch.where(indices >= 0, indices, logits.detach().argmax(dim=-1))


# ---- batch conveniences ------------------------------------------------------------------------


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


def record_attention_gradients(
    model: nn.Module | LoadedModel, images: torch.Tensor, targets: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The maps of every layer and their gradients for a class, from one forward and one backward pass.

    ``targets`` ``[b]`` are class indices (default: each image's top prediction). Returns logits
    ``[b, classes]``, attentions and ∂ logit[target] / ∂ attention, both ``[b, layers, heads, n, n]``,
    detached.
    """
    module, adapter = resolve(model)
    captured = capture(model, images, StackingSink(adapter.map_shape(module)[0]), target=TOP if targets is None else targets)
    return captured.logits, captured.kept, captured.gradients


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
            attentions = self._sink.result()
        finally:
            self._sink.clear()
        return logits, attentions
