"""Adapter for Hugging Face ``transformers`` ViT, DeiT, DINOv2 and DINOv2-with-registers models.

With the default ``sdpa`` attention no hook sees a map (and ``output_attentions=True`` silently returns none). While
capturing, the adapter registers an attention function of its own (``captured_attention``: transformers' eager
attention, each map handed to the sink as it is made) and switches the model to it, and back afterwards. A pass without
gradients into a sink that keeps every whole map writes each softmax straight into the sink's place for it.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager
from functools import partial

import torch
from torch import nn

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import (
    ELEMENTWISE,
    IMAGENET_MEAN,
    IMAGENET_STD,
    CaptureAdapter,
    LoadedModel,
    Preprocess,
    insert_zero_token,
    map_place,
    softmax_in_place,
)
from vit_explorer.models.layout import TokenLayout, check_input_hw
from vit_explorer.models.refusals import unreadable

MODEL_TYPES = {"vit", "deit", "dinov2", "dinov2_with_registers"}
RESAMPLE_NAMES = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL's numbers, as image processors store them


def require_transformers():
    try:
        import transformers
    except ImportError:
        raise VitExplorerError("Hugging Face models need transformers: pip install 'vit-explorer[hf]'") from None
    return transformers


class HFAdapter(CaptureAdapter):
    """Eager attention during capture; maps from ``outputs.attentions``."""

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        config = getattr(module, "config", None)
        return type(module).__module__.startswith("transformers.") and getattr(config, "model_type", None) in MODEL_TYPES

    def map_shape(self, module: nn.Module) -> tuple[int, int]:
        return module.config.num_hidden_layers, module.config.num_attention_heads

    def num_classes(self, module: nn.Module) -> int:
        # a bare backbone (ViTModel, Dinov2Model) has no head; a head of 0 labels is an Identity
        head = getattr(module, "classifier", None) or getattr(module, "cls_classifier", None)
        return head.out_features if isinstance(head, nn.Linear) else 0

    def classify(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        if not self.num_classes(module):
            return hidden.new_zeros(hidden.shape[0], 0)
        sequence = self.final_tokens(module, hidden)
        if hasattr(module, "distillation_classifier"):  # DeiT with its teacher's token: the two heads' mean
            return (module.cls_classifier(sequence[:, 0]) + module.distillation_classifier(sequence[:, 1])) / 2
        if module.config.model_type.startswith("dinov2"):  # the class token beside the mean of the patch tokens
            first_patch = 1 + (getattr(module.config, "num_register_tokens", 0) or 0)
            return module.classifier(torch.cat([sequence[:, 0], sequence[:, first_patch:].mean(dim=1)], dim=1))
        return module.classifier(sequence[:, 0])

    def final_tokens(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return module.base_model.layernorm(hidden)

    def pool(self, module: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        return tokens[:, 0]  # the pooled output of ViT, DeiT and DINOv2 backbones: the class token after the final norm

    def activations(self, module: nn.Module) -> list[nn.Module]:
        return transformers_activations(module)

    def mlp_activations(self, module: nn.Module) -> list[nn.Module]:
        found = []
        for block in self.blocks(module):
            mlp = getattr(block, "mlp", None)
            if mlp is not None and hasattr(mlp, "fc1") and isinstance(getattr(mlp, "activation_fn", None), nn.Module):
                found.append(mlp.activation_fn)  # transformers 5: fc1, activation_fn, fc2
            elif isinstance(getattr(getattr(block, "intermediate", None), "intermediate_act_fn", None), nn.Module):
                found.append(block.intermediate.intermediate_act_fn)  # transformers 4: ViTIntermediate
            else:
                raise VitExplorerError(f"{type(mlp).__name__}: this MLP is gated (SwiGLU-like), so its neurons are not the "
                                       "output of one activation; a test-time register needs a plain MLP")
        return found

    def add_prefix_token(self, module: nn.Module, at: int) -> None:
        if module.config.model_type.startswith("dinov2") and self.num_classes(module):
            raise VitExplorerError("a DINOv2 classifier reads the mean of every token after its prefix tokens, which would "
                                   "take a test-time register in: add one to the backbone (Dinov2Model) instead")
        # the embeddings' output (class, distillation and register tokens, patches, position embedding, dropout) is the
        # stream entering the first layer
        module.base_model.embeddings.register_forward_hook(partial(insert_zero_token, at))

    def blocks(self, module: nn.Module) -> list[nn.Module]:
        base = module.base_model
        # transformers 5 keeps ViT's and DeiT's layers on the base model, DINOv2's still in an encoder
        return list(base.encoder.layer if hasattr(base, "encoder") else base.layers)

    def attention_writes(self, module: nn.Module) -> list[nn.Module]:
        # ViT and DeiT add the attention block's output; DINOv2 scales it first (``layer_scale1``)
        return [block.layer_scale1 if hasattr(block, "layer_scale1") else block.attention for block in self.blocks(module)]

    def head_projections(self, module: nn.Module) -> list[nn.Module]:
        return [attention.o_proj for attention in self.attention_modules(module)]

    def attention_modules(self, module: nn.Module) -> list[nn.Module]:
        """One module per layer: the one that calls the attention function (it alone holds ``is_causal``)."""
        found = [[part for part in block.modules() if hasattr(part, "is_causal")] for block in self.blocks(module)]
        if any(len(parts) != 1 for parts in found):
            raise VitExplorerError(f"this transformers version's {type(module).__name__} has no single attention module per "
                                   f"layer that vit_explorer can edit")
        return [parts[0] for parts in found]

    def layout(self, module: nn.Module, input_hw: tuple[int, int]) -> TokenLayout:
        config = module.config
        names = ["cls"]
        if config.model_type == "deit":
            names.append("dist")
        names += [f"reg{i + 1}" for i in range(getattr(config, "num_register_tokens", 0) or 0)]
        patch = config.patch_size
        check_input_hw(input_hw, (patch, patch))
        return TokenLayout(prefix_names=tuple(names), grid_hw=(input_hw[0] // patch, input_hw[1] // patch),
                           patch_hw=(patch, patch))

    reads_attention_inputs = True  # transformers' ``sdpa`` attention function calls SDPA once per layer

    def fused(self, module: nn.Module) -> AbstractContextManager[None]:
        return self.implementation(module, "sdpa")

    def implementation(self, module: nn.Module, name: str) -> AbstractContextManager[None]:
        return attention_implementation(module, name)

    @staticmethod
    def run(module: nn.Module, pixels: torch.Tensor, **options):
        """The model's outputs for ``pixels``, at whatever input size the layout allows."""
        if "interpolate_pos_encoding" in inspect.signature(module.forward).parameters:
            options["interpolate_pos_encoding"] = True
        return module(pixel_values=pixels, **options)

    @staticmethod
    def logits_of(outputs, pixels: torch.Tensor) -> torch.Tensor:
        logits = getattr(outputs, "logits", None)
        return logits if logits is not None else pixels.new_zeros(pixels.shape[0], 0)

    def logits(self, module: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        return self.logits_of(self.run(module, pixels), pixels)

    @contextmanager
    def attached(self, module: nn.Module,
                 sink: MutableMapping[int, torch.Tensor]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        attentions = self.attention_modules(module)
        require_transformers().AttentionInterface.register(CAPTURED, captured_attention)
        try:
            for layer, attention in enumerate(attentions):
                _captures[attention] = (layer, sink)
            with self.implementation(module, CAPTURED):
                yield partial(self.logits, module)
        finally:
            for attention in attentions:
                _captures.pop(attention, None)

    @contextmanager
    def edited(self, module: nn.Module,
               edits: Mapping[int, Callable[[torch.Tensor], torch.Tensor]]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        attentions = self.attention_modules(module)
        with editing_attention(module, {attentions[layer]: edit for layer, edit in edits.items()}):
            yield partial(self.logits, module)


@contextmanager
def editing_attention(module: nn.Module, edits: Mapping[nn.Module, Callable[[torch.Tensor], torch.Tensor]]) -> Iterator[None]:
    """While active, ``module`` computes attention with transformers' eager function (``edited_attention``), each
    attention module in ``edits`` passing its map through its edit. The edits reach the attention function through a
    table by attention module: not every family passes its forward's keywords down to it (SigLIP does not)."""
    require_transformers().AttentionInterface.register(EDITED, edited_attention)
    try:
        _edits.update(edits)
        with attention_implementation(module, EDITED):
            yield
    finally:
        for attention in edits:
            _edits.pop(attention, None)


@contextmanager
def attention_implementation(module: nn.Module, name: str) -> Iterator[None]:
    """``module`` computes attention with the registered attention function ``name`` while active."""
    previous = module.config._attn_implementation
    if previous != name:
        module.set_attn_implementation(name)
    try:
        yield
    finally:
        if previous != name:
            module.set_attn_implementation(previous)


EDITED = "vit_explorer_edited"  # the attention function ``editing_attention`` registers
# the edit of each attention module while ``editing_attention`` is active (capture's lock keeps one pass per model)
_edits: weakref.WeakKeyDictionary[nn.Module, Callable[[torch.Tensor], torch.Tensor]] = weakref.WeakKeyDictionary()


def transformers_activations(module: nn.Module) -> list[nn.Module]:
    """Every element-wise non-linearity of a transformers model: its own (GELUActivation, ...) are modules of
    transformers.activations."""
    return [part for part in module.modules()
            if isinstance(part, ELEMENTWISE) or type(part).__module__ == "transformers.activations"]


def edited_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None,
                     scaling: float | None = None, dropout: float = 0.0, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' eager attention (``eager_attention_forward`` of ViT, DeiT and DINOv2), the map after dropout
    passed through the edit ``HFAdapter.edited`` holds for ``module``, if any. ``query``, ``key``, ``value``
    are ``[b, heads, n, head_dim]``; returns the heads' outputs ``[b, n, heads, head_dim]`` and the map."""
    scores = torch.matmul(query, key.transpose(2, 3)) * (query.size(-1) ** -0.5 if scaling is None else scaling)
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)  # [b, heads, n, n]
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    edit = _edits.get(module)
    if edit is not None:
        weights = edit(weights)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


CAPTURED = "vit_explorer_captured"  # the attention function ``HFAdapter.attached`` registers
# each attention module's layer and the sink its map goes to while ``HFAdapter.attached`` is active
_captures: weakref.WeakKeyDictionary[nn.Module, tuple[int, MutableMapping[int, torch.Tensor]]] = weakref.WeakKeyDictionary()


def captured_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                       **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' eager attention (``edited_attention`` without an edit), its map ``[b, heads, n, n]`` handed to the
    sink of ``module``'s layer. Without gradients, in float32 and unmasked, q·kᵀ and the softmax are written into the
    sink's place for the map where it offers one (``slot``): the same operations, without a copy of every map."""
    layer, sink = _captures[module]
    slot = getattr(sink, "slot", None)
    place = map_place(None if slot is None else partial(slot, layer), (*query.shape[:3], key.shape[2]), query.dtype,
                      query.device, plain=attention_mask is None and query.dtype == torch.float32 and not module.training)
    if place is None:
        output, weights = edited_attention(module, query, key, value, attention_mask, scaling, dropout)
    else:
        torch.matmul(query, key.transpose(2, 3), out=place).mul_(query.size(-1) ** -0.5 if scaling is None else scaling)
        weights = softmax_in_place(place)
        output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    sink[layer] = weights
    return output, weights


def preprocess_from(module: nn.Module, source: str | None) -> Preprocess:
    """Input size, mean, std and resampling from the model's image processor (or the config's defaults)."""
    config = module.config
    size = (config.image_size, config.image_size) if isinstance(config.image_size, int) else tuple(config.image_size)
    mean, std, interpolation = IMAGENET_MEAN, IMAGENET_STD, "bicubic"
    if source is not None:
        transformers = require_transformers()
        try:
            processor = transformers.AutoImageProcessor.from_pretrained(source)
        except (OSError, ValueError):
            processor = None
        if processor is not None:
            mean = tuple(getattr(processor, "image_mean", None) or mean)
            std = tuple(getattr(processor, "image_std", None) or std)
            interpolation = RESAMPLE_NAMES.get(int(getattr(processor, "resample", 3) or 3), "bicubic")
            crop = getattr(processor, "crop_size", None) or {}
            if "height" in crop:
                size = (crop["height"], crop["width"])
    return Preprocess(input_hw=size, mean=mean, std=std, interpolation=interpolation)


def from_hf_module(module: nn.Module, name: str, source: str | None = None, input_hw: tuple[int, int] | None = None,
                   adapter: CaptureAdapter | None = None) -> LoadedModel:
    """A ``LoadedModel`` around a built transformers model (through ``adapter``, default ``HFAdapter``; a Swin's is a
    ``swin_adapter.StageAdapter``); labels from ``config.id2label``."""
    adapter = adapter or HFAdapter()
    if not adapter.matches(module):
        raise VitExplorerError(unreadable(name, type(module).__name__, "the Hugging Face ViTs of types "
                                                                       f"{', '.join(sorted(MODEL_TYPES))}, "
                                          "CLIP, SigLIP, Swin and Swin V2 (timm:NAME@FILE reads more families)"))
    module.eval()
    preprocess = preprocess_from(module, source)
    if input_hw is not None:
        preprocess = Preprocess(input_hw=input_hw, mean=preprocess.mean, std=preprocess.std,
                                interpolation=preprocess.interpolation)
    num_labels = adapter.num_classes(module)
    id2label = module.config.id2label or {}
    labels = [id2label.get(i, f"class {i}") for i in range(num_labels)] if num_labels else None
    layout = adapter.layout(module, preprocess.input_hw)
    trained = adapter.layout(module, preprocess_from(module, None).input_hw).grid_hw  # the config's image size
    resampled = (f"position embedding resampled by transformers from its {trained[1]}×{trained[0]} grid to {layout.grid_hw[1]}×"
                 f"{layout.grid_hw[0]} on every pass (interpolate_pos_encoding): the maps are not the model's at its own grid")
    notes = adapter.family_notes(module) + ([] if trained == layout.grid_hw else [resampled])
    return LoadedModel(module=module, name=name, preprocess=preprocess, layout=layout, adapter=adapter, labels=labels,
                       notes=notes)
