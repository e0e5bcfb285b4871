"""The interface every model family implements: how to run it and where its attention appears."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.attention_inputs import AttentionInputs, recording_sdpa
from vit_explorer.models.layout import TokenLayout
from vit_explorer.models.ood import OodCalibration
from vit_explorer.models.text import TextTower

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# the element-wise activations of the families we load (each adapter may add its library's own)
ELEMENTWISE = (nn.GELU, nn.ReLU, nn.SiLU, nn.Mish, nn.Tanh)

HEAD_TOO = "the classifier head is missing too; alone, that would load the model as a backbone"


def layer_norms_of(module: nn.Module) -> list[nn.Module]:
    """Every LayerNorm of ``module``."""
    return [part for part in module.modules() if isinstance(part, nn.LayerNorm)]


def listed(names: list[str], limit: int = 8) -> str:
    """``names`` quoted for a message, the first ``limit`` of them."""
    shown = ", ".join(repr(name) for name in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


@dataclass(frozen=True)
class Preprocess:
    """How an image becomes the model's input: resize to ``input_hw``, scale to [0, 1], normalise."""

    input_hw: tuple[int, int]
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    interpolation: str = "bilinear"


class CaptureAdapter(ABC):
    """Knows, for one model family, where the post-softmax attention appears and what the tokens are.

    Nothing outside an adapter asks which family a model belongs to.
    """

    @classmethod
    @abstractmethod
    def matches(cls, module: nn.Module) -> bool:
        """Whether this adapter understands ``module``."""

    @abstractmethod
    def layout(self, module: nn.Module, input_hw: tuple[int, int]) -> TokenLayout:
        """The token layout of ``module`` for an input of ``input_hw`` pixels."""

    @abstractmethod
    def map_shape(self, module: nn.Module) -> tuple[int, int]:
        """(layers, heads) of the attention maps ``module`` produces, known before running it."""

    @abstractmethod
    @contextmanager
    def attached(self, module: nn.Module,
                 sink: MutableMapping[int, torch.Tensor]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """While active, the yielded function maps pixels ``[b, 3, H, W]`` to logits ``[b, classes]``
        and stores each layer's attention ``[b, heads, n, n]`` in ``sink[layer]``.

        Everything the adapter changed on the module (hooks, fused-attention switches) is undone
        on exit, also when the forward raised.
        """

    # whether ``recorded_inputs`` reads this family: its attention is softmax(q·kᵀ + bias), one SDPA call per layer on the
    # path ``fused`` switches on (or an adapter's own reading of q and k). A family that is not keeps its maps the way
    # ``attached`` hands them over.
    reads_attention_inputs: bool = False

    @contextmanager
    def fused(self, module: nn.Module) -> Iterator[None]:
        """Make ``module`` compute each layer's attention with one ``scaled_dot_product_attention`` call (default: it
        does)."""
        yield

    @contextmanager
    def recorded_inputs(self, module: nn.Module,
                        record: Callable[[int, AttentionInputs], None]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """While active, the yielded function maps pixels ``[b, 3, H, W]`` to logits ``[b, classes]`` by the model's own
        fused forward, and each layer's attention inputs reach ``record(layer, inputs)`` as it runs (``AttentionInputs``):
        no map is made. Undone on exit, also when the forward raised."""
        if not self.reads_attention_inputs:
            raise VitExplorerError(f"{type(module).__name__}: vit_explorer does not know this family's queries and keys; its "
                                   "maps are captured whole")
        with self.fused(module), recording_sdpa(record, self.blocks(module)):
            yield partial(self.logits, module)

    @abstractmethod
    def num_classes(self, module: nn.Module) -> int:
        """How many class scores ``module`` gives, known before running it; 0 for a backbone without a classifier head."""

    @abstractmethod
    def blocks(self, module: nn.Module) -> list[nn.Module]:
        """One module per transformer layer, in layer order, holding all of that layer's parameters."""

    def window_adapter(self, module: nn.Module) -> Any:
        """For a stage of a windowed ViT (a Swin), the adapter of the whole model (``swin_adapter.WindowAdapter``), whose
        methods chain every stage; None for a model with one grid."""
        return None

    def num_stages(self, module: nn.Module) -> int:
        """How many stages, each with a grid of its own, ``module`` has (a Swin's four); 1 for a plain ViT."""
        return 1

    def at_stage(self, module: nn.Module, stage: int) -> CaptureAdapter:
        """The adapter that reads stage ``stage`` of ``module`` (``num_stages``); a plain ViT's one stage is itself."""
        if stage != 0:
            raise VitExplorerError(f"{type(module).__name__} has one patch grid, not stages: there is no stage {stage}")
        return self

    def family_notes(self, module: nn.Module) -> list[str]:
        """What a user should know about how this family's maps are laid out, shown with the model (default: nothing)."""
        return []

    def residual_modules(self, module: nn.Module) -> list[nn.Module]:
        """One module per layer, in layer order, whose forward hook sees the residual stream after that layer
        (default: ``blocks``, which return it)."""
        return self.blocks(module)

    def residual_after(self, inputs: tuple, output: Any) -> torch.Tensor:
        """The residual stream after a layer ``[b, n, dim]``, from the inputs and output of its ``residual_modules`` entry."""
        return output[0] if isinstance(output, tuple) else output

    def with_residual(self, inputs: tuple, output: Any, stream: torch.Tensor) -> Any:
        """The output of a layer's ``residual_modules`` entry that makes ``residual_after(inputs, output)`` equal to
        ``stream`` ``[b, n, dim]``: a forward hook returning it replaces the residual stream after that layer."""
        return (stream, *output[1:]) if isinstance(output, tuple) else stream

    @contextmanager
    def layer_outputs(self, module: nn.Module, record: Callable[[int, torch.Tensor], None]) -> Iterator[None]:
        """While active, each forward pass calls ``record(layer, hidden)`` with the residual stream after every
        layer ``[b, n, dim]`` (after the layer's last residual addition, before any final norm). Hooks are
        removed on exit, also when the forward raised."""

        def hook(layer: int, _module: nn.Module, inputs: tuple, output: Any) -> None:
            record(layer, self.residual_after(inputs, output))

        handles = []
        try:
            for layer, hooked in enumerate(self.residual_modules(module)):
                handles.append(hooked.register_forward_hook(partial(hook, layer)))
            yield
        finally:
            for handle in handles:
                handle.remove()

    def attention_writes(self, module: nn.Module) -> list[nn.Module]:
        """One module per layer, in layer order, whose forward output (its first element, for a tuple) is exactly what
        that layer's attention adds to the residual stream ``[b, n, dim]``: the heads' outputs through the out-projection
        and any layer scale, affine in the post-softmax map. The decomposition reads each head's share of it there; a
        family whose blocks write anything else (a norm after attention, a parallel branch) refuses."""
        raise VitExplorerError(f"{type(module).__name__} cannot be decomposed into heads: vit_explorer does not know where "
                               "its attention writes to the residual stream")

    def head_projections(self, module: nn.Module) -> list[nn.Module]:
        """One module per layer, in layer order, whose first positional input is that layer's heads' outputs (each the
        attention-weighted sum of its values) concatenated head by head ``[b, n, heads · head_dim]``: the out-projection.
        Activation patching replaces one head's slice there."""
        raise VitExplorerError(f"{type(module).__name__}: vit_explorer does not know where its heads' outputs meet, so it "
                               "cannot patch one head")

    def attention_width(self, module: nn.Module) -> int:
        """heads × head_dim: the width of one token's queries (and keys) in a layer, known before running ``module``
        (default: the input width of ``head_projections``)."""
        return self.head_projections(module)[0].in_features

    @abstractmethod
    def classify(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """The logits ``[b, classes]`` the model would give if ``hidden`` ``[b, n, dim]`` were the residual stream after
        its last layer: the final norm, the model's pooling and its classifier head (``[b, 0]`` for a backbone).
        LeGrad reads every layer's stream through it."""

    # The sequence index of the one token whose output ``classify`` reads (a clicked patch's own token), or None
    # where it reads the model's pooling of all of them: a class head, a backbone's embedding.
    read_token: int | None = None

    @abstractmethod
    def final_tokens(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """Every token's output embedding ``[b, n, dim]`` if ``hidden`` ``[b, n, dim]`` were the residual stream after the
        last layer: the model's final norm."""

    @abstractmethod
    def pool(self, module: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        """The image's embedding ``[b, dim']`` from ``final_tokens``: the model's own pooling (class token or mean) and
        whatever it applies before a head; what a backbone hands on."""

    def layer_embedding(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """The image's embedding ``[b, dim']`` as LeGrad reads it from a layer's stream ``hidden`` ``[b, n, dim]``: the
        model's own read-out (``final_tokens``, then ``pool``), unless a family's reference reads it otherwise."""
        return self.pool(module, self.final_tokens(module, hidden))

    def layer_readout(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """The logits ``[b, classes]`` LeGrad reads from a layer's stream ``hidden`` ``[b, n, dim]``: ``classify``, unless
        a target reads the embedding as a family's reference does (``layer_embedding``)."""
        return self.classify(module, hidden)

    def layer_norms(self, module: nn.Module) -> list[nn.Module]:
        """Every LayerNorm of ``module`` (AttnLRP treats their scale as a constant)."""
        return layer_norms_of(module)

    def mlp_activations(self, module: nn.Module) -> list[nn.Module]:
        """One module per layer, in layer order, whose forward output is that layer's MLP hidden activation
        ``[b, n, hidden]``, after the non-linearity and before the second linear layer: the neurons a test-time register
        reads and moves (``methods.registers``)."""
        raise VitExplorerError(f"{type(module).__name__}: vit_explorer does not know where its MLP neurons are, so it cannot "
                               "add a test-time register to it")

    def add_prefix_token(self, module: nn.Module, at: int) -> None:
        """Make ``module`` insert one token of zeros at sequence position ``at`` (right after its ``at`` prefix tokens),
        where its tokens enter the first block (after the position embedding, which the token does not get), and count it
        among its prefix tokens from then on.
        Permanent: the caller owns ``module`` (a copy). A test-time register is this token (``methods.registers``)."""
        raise VitExplorerError(f"{type(module).__name__}: vit_explorer does not know where its tokens enter its first block, "
                               "so it cannot add a test-time register to it")

    def activations(self, module: nn.Module) -> list[nn.Module]:
        """Every element-wise non-linearity module of ``module`` (AttnLRP passes relevance through them by the
        identity rule)."""
        return [part for part in module.modules() if isinstance(part, ELEMENTWISE)]

    def logits(self, module: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels ``[b, 3, H, W]`` → logits ``[b, classes]`` by the model's normal forward, no capture
        (``[b, 0]`` for a backbone without a classifier head)."""
        return module(pixels)

    @abstractmethod
    @contextmanager
    def edited(self, module: nn.Module,
               edits: Mapping[int, Callable[[torch.Tensor], torch.Tensor]]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """While active, the yielded function maps pixels ``[b, 3, H, W]`` to logits ``[b, classes]``, each
        layer ``l`` in ``edits`` multiplying the values by ``edits[l](A)`` instead of its post-softmax map
        ``A`` ``[b, heads, n, n]`` (the map ``attached`` captures). Every layer runs the explicit path that
        ``attached`` captures (unfused, eager), with or without an edit, so that edited and unedited logits
        come from the same arithmetic. Undone on exit, also when the forward raised."""

    def stream_entries(self, module: nn.Module) -> list[nn.Module]:
        """One module per layer, in layer order, whose first positional input is the residual stream entering
        that layer ``[b, n, dim]``, such that a stream widened along the batch there flows on through the rest
        of the model (default: ``blocks``)."""
        return self.blocks(module)

    @contextmanager
    def branched(self, module: nn.Module, layer: int, copies: int) -> Iterator[None]:
        """While active, a forward pass of one image repeats the residual stream entering ``layer`` ``copies``
        times along the batch: the layers below run once, the layers from ``layer`` on and the head once per
        copy, giving logits ``[copies, classes]``. The hook is removed on exit, also when the forward raised."""

        def widen(_module: nn.Module, inputs: tuple) -> tuple:
            if not inputs or inputs[0].shape[0] != 1:
                raise RuntimeError(f"{type(self).__name__} can branch the residual stream of one image passed positionally")
            return (inputs[0].expand(copies, *inputs[0].shape[1:]).contiguous(), *inputs[1:])

        handle = self.stream_entries(module)[layer].register_forward_pre_hook(widen)
        try:
            yield
        finally:
            handle.remove()


def keeping(sink: MutableMapping[int, torch.Tensor], layers: int) -> dict[int, Callable[[torch.Tensor], torch.Tensor]]:
    """The edits of ``layers`` layers that put each map in ``sink`` and change nothing: a capture, as an edit."""
    return {layer: partial(kept, sink, layer) for layer in range(layers)}


def kept(sink: MutableMapping[int, torch.Tensor], layer: int, attention: torch.Tensor) -> torch.Tensor:
    sink[layer] = attention
    return attention


def map_place(slot: Callable[..., torch.Tensor | None] | None, shape: tuple[int, ...], dtype: torch.dtype,
              device: torch.device, plain: bool = True) -> torch.Tensor | None:
    """Where an attention map ``[b, heads, n, n]`` can be computed in place: the sink's place for it (``slot(shape, dtype,
    device)``, a capture sink's ``slot`` for one layer), where it offers one, on a pass without gradients (``out=`` takes
    none) of a ``plain`` attention (no mask), as one contiguous block; else None, and the map is handed over as usual."""
    if slot is None or not plain or torch.is_grad_enabled():
        return None
    place = slot(shape, dtype, device)
    return place if place is not None and place.is_contiguous() else None


def softmax_in_place(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` ``[..., n]`` turned into their softmax over the last axis in place, row by row: the same values as
    ``torch.softmax``."""
    return torch.ops.aten._softmax.out(scores, -1, False, out=scores)


class HookAdapter(CaptureAdapter):
    """An adapter for families whose attention is the output of one module per layer."""

    @abstractmethod
    def softmax_modules(self, module: nn.Module) -> list[nn.Module]:
        """One module per layer, in layer order, whose forward output is the post-softmax map."""

    @contextmanager
    def unfused(self, module: nn.Module) -> Iterator[None]:
        """Make ``module`` compute attention through ``softmax_modules`` (default: it already does)."""
        yield

    @contextmanager
    def attached(self, module: nn.Module,
                 sink: MutableMapping[int, torch.Tensor]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        with self.edited(module, keeping(sink, len(self.softmax_modules(module)))) as forward:
            yield forward

    @contextmanager
    def edited(self, module: nn.Module,
               edits: Mapping[int, Callable[[torch.Tensor], torch.Tensor]]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        hook_modules = self.softmax_modules(module)
        if not hook_modules:
            raise VitExplorerError(f"{type(module).__name__} has no attention layers that vit_explorer can capture")

        def edit(layer: int, _module: nn.Module, _inputs: tuple, output: torch.Tensor) -> torch.Tensor:
            return edits[layer](output)  # a forward hook's return value replaces the module's output

        handles = []
        try:
            with self.unfused(module):
                for layer in edits:
                    handles.append(hook_modules[layer].register_forward_hook(partial(edit, layer)))
                yield partial(self.logits, module)
        finally:
            for handle in handles:
                handle.remove()


@dataclass
class LoadedModel:
    """A model ready for analysis: module in eval mode, preprocessing, token layout, labels, adapter."""

    module: nn.Module
    name: str
    preprocess: Preprocess
    layout: TokenLayout
    adapter: CaptureAdapter
    labels: list[str] | None = None
    notes: list[str] = field(default_factory=list)
    # what its text tower read of each prompt, for a model prompted as a classifier (``targets.prompt_model``)
    prompt_notes: list[str] = field(default_factory=list)
    # statistics that tell when an image is outside what the model knows (``ood``); None: never flagged
    ood: OodCalibration | None = None
    random_weights: bool = False  # built with freshly initialised weights (``@random``): nothing learned
    text: TextTower | None = None  # the text tower of a CLIP-like model: prompts become its classes (``targets.prompt_model``)
    # facts of the module's structure, read from it once through the adapter (a different adapter or module is a
    # different LoadedModel: ``dataclasses.replace`` reads them again)
    num_classes: int = field(init=False)  # class scores per image; 0 for a backbone, which has no class to explain
    map_shape: tuple[int, int] = field(init=False)  # (layers, heads) of the attention maps capture records

    def __post_init__(self) -> None:
        self.num_classes = self.adapter.num_classes(self.module)
        self.map_shape = self.adapter.map_shape(self.module)

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    @property
    def windowed(self) -> bool:
        """Whether this reads a stage of a windowed ViT (a Swin), whose class maps chain every stage (``core.stage_maps``)."""
        return self.adapter.window_adapter(self.module) is not None

    @property
    def forward_flops(self) -> float:
        """About what one forward pass of one image costs: 2 × parameters × tokens (each weight is a multiply and an
        add for each token; attention's own products are left out, so long sequences cost more than this says)."""
        return 2.0 * sum(parameter.numel() for parameter in self.module.parameters()) * self.layout.num_tokens

    def logits(self, pixels: torch.Tensor) -> torch.Tensor:
        """The normal forward without capture, under ``torch.inference_mode`` ``[b, classes]``."""
        with torch.inference_mode():
            return self.adapter.logits(self.module, pixels.to(self.device))



def insert_zero_token(at: int, _module: nn.Module, _inputs: tuple, tokens: torch.Tensor) -> torch.Tensor:
    """A forward hook's output: ``tokens`` ``[b, n, dim]`` with one token of zeros inserted before position ``at``."""
    zeros = tokens.new_zeros(tokens.shape[0], 1, tokens.shape[2])
    return torch.cat([tokens[:, :at], zeros, tokens[:, at:]], dim=1)
