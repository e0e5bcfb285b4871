"""Adapter for timm ViT-style models (ViT, DeiT, DINO, DINOv2 with registers, CLIP towers, EVA, BEiT).

timm computes attention with ``scaled_dot_product_attention`` when ``fused_attn`` is set, which no
hook can see. Each block's attention module also has an explicit path,
``softmax → attn_drop → @ v``; for the capture the adapter flips ``fused_attn`` off on every block
(it is read per module, so the global ``set_fused_attn`` would not reach built models), hooks
``attn_drop``, and restores each flag afterwards.

A pass without gradients into a sink that keeps every whole map (``slot``) goes one step further for timm's plain
``Attention``: its softmax is computed straight into the sink's place for the map (``attention_in_place``), which saves
a copy of every map and the allocation of two more.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path

import torch
from torch import nn

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import (
    ELEMENTWISE,
    HEAD_TOO,
    HookAdapter,
    LoadedModel,
    Preprocess,
    insert_zero_token,
    listed,
    map_place,
    softmax_in_place,
)
from vit_explorer.models.hub import load_cached_or_fetch
from vit_explorer.models.layout import TokenLayout, check_input_hw
from vit_explorer.models.refusals import unreadable


def require_timm():
    try:
        import timm
    except ImportError:
        raise VitExplorerError("timm models need the timm package: pip install 'vit-explorer[timm]'") from None
    return timm


def attention_modules(module: nn.Module) -> list[nn.Module | None]:
    """Each block's ``attn`` (None for a block without one: Twins', CrossViT's and TNT's blocks are not a ViT's)."""
    return [getattr(block, "attn", None) for block in getattr(module, "blocks", [])]


@contextmanager
def fused_attention(attentions: list[nn.Module], fused: bool) -> Iterator[None]:
    """``attentions`` (timm attention modules) on timm's fused path (SDPA) or their explicit one while active; each flag
    restored on exit."""
    saved = [attention.fused_attn for attention in attentions]
    try:
        for attention in attentions:
            attention.fused_attn = fused
        yield
    finally:
        for attention, flag in zip(attentions, saved, strict=True):
            attention.fused_attn = flag


class TimmAdapter(HookAdapter):
    """Hooks ``blocks[i].attn.attn_drop`` with fused attention switched off during capture."""

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        """A plain ViT: one patch grid (``patch_embed`` with its size, grid and patch), prefix tokens, and blocks whose
        ``attn`` is a softmax over all tokens. XCiT's ``blocks[i].attn`` attends over channels, and the hierarchical
        families (Swin, Hiera, MViT, PVT, LeViT) have no single grid: their ``patch_embed`` lacks those sizes."""
        attentions = attention_modules(module)
        patch_embed = getattr(module, "patch_embed", None)
        return (
            type(module).__module__.startswith("timm.")
            and bool(attentions)
            and all(hasattr(attention, "fused_attn") and isinstance(getattr(attention, "attn_drop", None), nn.Dropout)
                    for attention in attentions)
            and hasattr(module, "num_prefix_tokens")
            and all(hasattr(patch_embed, size) for size in ("img_size", "grid_size", "patch_size"))
            # its patches are cut from the image itself, not from a convolutional stem's features (ViTamin, hybrids)
            and [g * p for g, p in zip(patch_embed.grid_size, patch_embed.patch_size, strict=True)] == list(patch_embed.img_size)
        )

    def softmax_modules(self, module: nn.Module) -> list[nn.Module]:
        return [attention.attn_drop for attention in attention_modules(module)]

    def blocks(self, module: nn.Module) -> list[nn.Module]:
        return list(module.blocks)

    def num_classes(self, module: nn.Module) -> int:
        return int(module.num_classes)

    reads_attention_inputs = True  # every timm attention ``matches`` admits calls SDPA once when ``fused_attn`` is set

    @contextmanager
    def unfused(self, module: nn.Module) -> Iterator[None]:
        with fused_attention(attention_modules(module), False):
            yield

    @contextmanager
    def fused(self, module: nn.Module) -> Iterator[None]:
        with fused_attention(attention_modules(module), True):
            yield

    @contextmanager
    def attached(self, module: nn.Module,
                 sink: MutableMapping[int, torch.Tensor]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        with ExitStack() as stack:
            forward = stack.enter_context(super().attached(module, sink))
            slot = getattr(sink, "slot", None)
            attentions = attention_modules(module)
            timm = require_timm()
            if slot is not None and all(type(attention) is timm.layers.Attention for attention in attentions):
                for layer, attention in enumerate(attentions):
                    # an instance attribute shadows the class's forward for this module only
                    attention.forward = partial(attention_in_place, attention, partial(slot, layer))
                    stack.callback(attention.__dict__.pop, "forward", None)
            yield forward

    def attention_writes(self, module: nn.Module) -> list[nn.Module]:
        # a pre-norm block adds ``ls1(attn(norm1(x)))``; BEiT's and EVA's ``gamma_1``, a norm inside the attention
        # (``scale_norm``) or a post-norm block write something else
        writes = []
        for block in module.blocks:
            inner_norm = getattr(block.attn, "norm", None)
            if not hasattr(block, "ls1") or not isinstance(getattr(block.attn, "proj", None), nn.Linear) or not (
                    inner_norm is None or isinstance(inner_norm, nn.Identity)):
                raise VitExplorerError(f"{type(block).__name__} blocks do not add ls1(attn(norm1(x))) to the residual stream, so "
                                       "their heads' direct contributions cannot be read off exactly")
            writes.append(block.ls1)
        return writes

    def head_projections(self, module: nn.Module) -> list[nn.Module]:
        return [block.attn.proj for block in module.blocks]

    def logits(self, module: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        output = module(pixels)
        # with num_classes=0 timm returns pooled features, which are not class scores
        return output if module.num_classes else output.new_zeros(output.shape[0], 0)

    def classify(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        if not module.num_classes:
            return hidden.new_zeros(hidden.shape[0], 0)
        # ``forward_features`` ends in ``norm``; ``forward_head`` pools (class token, mean, distillation) and classifies
        return module.forward_head(self.final_tokens(module, hidden))

    def final_tokens(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return module.norm(hidden)

    def pool(self, module: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        return module.forward_head(tokens, pre_logits=True)

    def mlp_activations(self, module: nn.Module) -> list[nn.Module]:
        mlps = [block.mlp for block in module.blocks]
        # timm's ``Mlp``: fc1 → act → drop → norm → fc2; a gated MLP (SwiGLU) multiplies after its activation
        if not all(type(mlp).__name__ == "Mlp" for mlp in mlps):
            raise VitExplorerError(f"{type(mlps[0]).__name__}: this MLP is gated (SwiGLU-like), so its neurons are not the "
                                   "output of one activation; a test-time register needs a plain MLP")
        return [mlp.act for mlp in mlps]

    def add_prefix_token(self, module: nn.Module, at: int) -> None:
        if type(module).__name__ != "VisionTransformer":
            raise VitExplorerError(f"{type(module).__name__}: a test-time register is added to timm's VisionTransformer only "
                                   "(a model with rotary position embeddings places its patches by their count)")
        # ``forward_features``: patch embedding, position embedding, ``patch_drop``, ``norm_pre``, the blocks. The token
        # goes in after the position embedding and before ``norm_pre`` (CLIP's ``ln_pre``), where Jiang et al. put it in
        # their CLIP; pooling skips ``num_prefix_tokens``
        module.patch_drop.register_forward_hook(partial(insert_zero_token, at))
        module.num_prefix_tokens += 1

    def activations(self, module: nn.Module) -> list[nn.Module]:
        return timm_activations(module)

    def map_shape(self, module: nn.Module) -> tuple[int, int]:
        attentions = attention_modules(module)
        return len(attentions), attentions[0].num_heads

    def layout(self, module: nn.Module, input_hw: tuple[int, int]) -> TokenLayout:
        names: list[str] = []
        if getattr(module, "cls_token", None) is not None:
            names.append("cls")
        if getattr(module, "dist_token", None) is not None:
            names.append("dist")
        names += [f"reg{i + 1}" for i in range(num_registers(module))]
        if len(names) != module.num_prefix_tokens:
            raise VitExplorerError(f"{type(module).__name__}: its {module.num_prefix_tokens} prefix tokens are not the class, "
                                   f"distillation and register tokens vit_explorer knows ({listed(names) or 'none'}), so its "
                                   "patches cannot be placed on the grid")
        patch_embed = module.patch_embed
        if getattr(module, "dynamic_img_size", False):
            grid = tuple(patch_embed.dynamic_feat_size(input_hw))
        else:
            grid = tuple(patch_embed.grid_size)
            expected = tuple(g * p for g, p in zip(grid, patch_embed.patch_size, strict=True))
            check_input_hw(input_hw, tuple(patch_embed.patch_size))
            if tuple(input_hw) != expected:
                raise VitExplorerError(f"this timm model takes {expected[0]}×{expected[1]} inputs, not "
                                       f"{input_hw[0]}×{input_hw[1]}")
        return TokenLayout(prefix_names=tuple(names), grid_hw=grid, patch_hw=tuple(patch_embed.patch_size))


def timm_activations(module: nn.Module) -> list[nn.Module]:
    """Every element-wise non-linearity of a timm model: timm's own (GELUTanh, QuickGELU, ...) live in
    timm.layers.activations."""
    return [part for part in module.modules()
            if isinstance(part, ELEMENTWISE) or type(part).__module__.startswith("timm.layers.activations")]


def num_registers(module: nn.Module) -> int:
    """The register tokens of a timm model: ``VisionTransformer`` counts them in ``num_reg_tokens``, ``Eva`` only in the
    shape of its ``reg_token`` ``[1, registers, dim]``."""
    registers = getattr(module, "reg_token", None)
    return registers.shape[1] if registers is not None else getattr(module, "num_reg_tokens", 0)


def attention_in_place(attention: nn.Module, slot: Callable[..., torch.Tensor | None], x: torch.Tensor,
                       attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
    """timm's ``Attention.forward`` on its explicit path, with q·kᵀ and the softmax written into ``slot(shape, dtype,
    device)``, the sink's place for this layer's map ``[b, heads, n, n]``. ``attn_drop`` still sees the map, so the
    capture's hook (and any edit) works as on timm's own path. Where the map cannot be written there (``map_place``),
    timm's own forward runs."""
    b, n, _ = x.shape
    place = map_place(slot, (b, attention.num_heads, n, n), x.dtype, x.device, plain=attn_mask is None and not is_causal)
    if place is None:
        return type(attention).forward(attention, x, attn_mask, is_causal)
    gate = attention.gate(x).sigmoid() if getattr(attention, "gate", None) is not None else None
    q, k, v = attention.qkv(x).reshape(b, n, 3, attention.num_heads, attention.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    q, k = attention.q_norm(q), attention.k_norm(k)
    torch.matmul(q * attention.scale, k.transpose(-2, -1), out=place)
    x = (attention.attn_drop(softmax_in_place(place)) @ v).transpose(1, 2).reshape(b, n, -1)
    x = getattr(attention, "norm", nn.Identity())(x)
    if gate is not None:
        x = x * gate
    return attention.proj_drop(attention.proj(x))


def built_patch_hw(name: str) -> tuple[int, int] | None:
    """The patch size of timm model ``name``, read off the architecture built on the meta device (no memory, no weights);
    None for a name timm does not know (its own error then follows)."""
    timm = require_timm()
    try:
        with torch.device("meta"):
            module = timm.create_model(name, pretrained=False)
    except Exception:  # noqa: BLE001 - an unknown name fails in the real build, with timm's own message
        return None
    patch_embed = getattr(module, "patch_embed", None)
    return tuple(patch_embed.patch_size) if patch_embed is not None else None


def imagenet_labels(module: nn.Module) -> list[str] | None:
    """Class names for ImageNet-trained timm models (shipped with timm, no download)."""
    timm = require_timm()
    subset = timm.data.infer_imagenet_subset(module)
    if subset is None:
        return None
    info = timm.data.ImageNetInfo(subset)
    if info.num_classes() != module.num_classes:
        return None
    return [info.index_to_description(index) for index in range(info.num_classes())]


def from_timm_module(module: nn.Module, name: str, input_hw: tuple[int, int] | None = None) -> LoadedModel:
    """A ``LoadedModel`` around a built timm model; its preprocessing comes from ``resolve_data_config``."""
    from vit_explorer.models.cait_adapter import CaitAdapter  # it builds on this module's adapter

    timm = require_timm()
    adapter = next((kind() for kind in (TimmAdapter, CaitAdapter) if kind.matches(module)), None)
    if adapter is None:
        raise VitExplorerError(unreadable(name, type(module).__name__, TIMM_READABLE, variant_reason(module)))
    config = timm.data.resolve_data_config(model=module)
    input_hw = input_hw or tuple(module.patch_embed.img_size)  # the size it was built for (the cfg may say otherwise)
    module.eval()
    return LoadedModel(
        module=module,
        name=name,
        preprocess=Preprocess(input_hw=input_hw, mean=tuple(config["mean"]), std=tuple(config["std"]),
                              interpolation=config.get("interpolation", "bicubic")),
        layout=adapter.layout(module, input_hw),
        adapter=adapter,
        labels=imagenet_labels(module) if module.num_classes else None,
        notes=adapter.family_notes(module) + (
            [] if getattr(module, "cls_token", None) is not None else ["no class token: maps use the mean over patch queries"]),
    )


def variant_reason(module: nn.Module) -> tuple[str, str] | None:
    """``(family, why)`` for a timm ``VisionTransformer`` built in a way the adapter does not read (whose class name
    alone does not tell it from a plain ViT), else None."""
    if type(module).__name__ != "VisionTransformer":
        return None
    if type(module.patch_embed).__name__ == "HybridEmbed":
        return "hybrid ViT", "whose patches are a convolutional stem's features, not cut from the image"
    if any(attention is None for attention in attention_modules(module)):
        return "parallel-block ViT", "whose blocks run several attentions side by side instead of one"
    return None


TIMM_READABLE = ("timm's plain ViTs, whose patches are cut from the image into one grid and whose every block attends over "
                 "all of them: ViT, DeiT, DeiT-III, BEiT, EVA-02, DINOv2, FlexiViT, SigLIP's and CLIP's image towers; "
                 "and CaiT")
RANDOM = "random"  # ``NAME@random``: the architecture with freshly initialised weights, no download


def stored_input_hw(path: Path) -> tuple[int, int] | None:
    """The input size whose patch grid the position embedding in the weights file ``path`` was trained for:
    ``pos_embed`` ``[1, prefix + g·g, dim]`` (the class token in it or not) and ``patch_embed.proj.weight``
    ``[dim, 3, patch_h, patch_w]``. None when the file does not say (other names, a non-square grid)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt") as handle:
                if not {"pos_embed", "patch_embed.proj.weight"} <= set(handle.keys()):
                    return None
                tokens = handle.get_slice("pos_embed").get_shape()[1]
                patch = handle.get_slice("patch_embed.proj.weight").get_shape()[-2:]
        else:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            if not {"pos_embed", "patch_embed.proj.weight"} <= set(state):
                return None
            tokens, patch = state["pos_embed"].shape[1], state["patch_embed.proj.weight"].shape[-2:]
    except Exception:  # noqa: BLE001 - a file timm itself cannot read fails in timm's load, with its own message
        return None
    for prefix in (1, 0):  # only one of n − 1 and n can be a square above 1
        side = math.isqrt(tokens - prefix)
        if side > 1 and side * side == tokens - prefix:
            return side * patch[0], side * patch[1]
    return None


def state_dict_keys(message: str, kind: str) -> list[str]:
    """The parameter names torch's strict ``load_state_dict`` error lists as ``kind`` (``Missing``, ``Unexpected``)."""
    line = re.search(rf"{kind} key\(s\) in state_dict: (.*)$", message, re.MULTILINE)
    return re.findall(r'"([^"]+)"', line.group(1)) if line else []


def classifier_names(name: str) -> tuple[str, ...]:
    """The classifier modules of timm model ``name`` (``head``; DeiT also ``head_dist``), from its pretrained cfg."""
    cfg = require_timm().models.get_pretrained_cfg(name)
    classifiers = getattr(cfg, "classifier", None) or ()
    return (classifiers,) if isinstance(classifiers, str) else tuple(classifiers)


def load_error(spec: str, message: str, classifiers: tuple[str, ...]) -> VitExplorerError:
    """A failed strict load, said as the parameters that did not fit."""
    missing, unexpected = state_dict_keys(message, "Missing"), state_dict_keys(message, "Unexpected")
    lacking = [key for key in missing if key.split(".")[0] not in classifiers] or missing
    mismatched = re.findall(r"size mismatch for ([^:]+): (.*)", message)
    parts = [f"the weights lack {listed(lacking)}, which would be initialised at random"
             + (f" ({HEAD_TOO})" if len(lacking) < len(missing) else "")] if missing else []
    parts += [f"the model has no parameter(s) {listed(unexpected)}"] if unexpected else []
    parts += [f"{key}: {detail.strip()}" for key, detail in mismatched[:3]]
    return VitExplorerError(f"timm:{spec}: {'; '.join(parts) or message.splitlines()[0]}")


def cfg_input_hw(name: str) -> tuple[int, int] | None:
    """The input size of timm model ``name``'s pretrained cfg (its weights' grid), None for a name timm does not know."""
    cfg = require_timm().models.get_pretrained_cfg(name)
    return tuple(cfg.input_size[1:]) if cfg is not None else None


def resampled_note(stored: tuple[int, int], input_hw: tuple[int, int]) -> str:
    return (f"position embedding resampled by timm from the weights' {stored[1]}×{stored[0]} input to "
            f"{input_hw[1]}×{input_hw[0]}: the maps are not the model's at its own grid")


def load_timm(spec: str, input_hw: tuple[int, int] | None = None) -> LoadedModel:
    """``NAME`` from the hub (the local cache first, through timm's own download), ``NAME@FILE`` from
    local weights, or ``NAME@random`` with random weights (the real token layout, no download).

    Loads are strict: a parameter the weights lack is an error naming it, except a missing classifier
    head, which loads the model as a backbone without classes (``num_classes=0``).
    """
    timm = require_timm()
    name, _, weights = spec.partition("@")
    kwargs = {"img_size": input_hw} if input_hw is not None else {}
    random_weights = weights == RANDOM
    notes: list[str] = []
    if weights and not random_weights:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise VitExplorerError(f"timm weights file {path} does not exist (or use timm:{name}@{RANDOM} for random weights)")
        kwargs["pretrained_cfg_overlay"] = {"file": str(path)}
        # timm resamples a position embedding to the size the model is built at, silently: build at the grid
        # the weights hold unless asked otherwise, and say so whenever the grid is resampled
        stored = stored_input_hw(path)
        if stored is not None and input_hw is None:
            kwargs["img_size"] = input_hw = stored
            default = cfg_input_hw(name)
            if default is not None and stored != default:
                notes.append(f"runs at {stored[1]}×{stored[0]}, the position grid the weights hold, not timm's {default[1]}×"
                             f"{default[0]} for {name}; --input-size resamples it")
        elif stored is not None and stored != tuple(input_hw):
            notes.append(resampled_note(stored, input_hw))
    elif not random_weights and input_hw is not None:  # hub weights hold the grid of their pretrained cfg
        default = cfg_input_hw(name)
        if default is not None and default != tuple(input_hw):
            notes.append(resampled_note(default, input_hw))
    if input_hw is not None:
        check_input_hw(input_hw, built_patch_hw(name))
    try:
        if random_weights:
            module = timm.create_model(name, pretrained=False, **kwargs)
        elif weights:
            try:
                module = timm.create_model(name, pretrained=True, **kwargs)
            except RuntimeError as error:
                missing = state_dict_keys(str(error), "Missing")
                head = [key for key in missing if key.split(".")[0] in classifier_names(name)]
                if not missing or head != missing:
                    raise
                # a backbone's weights: build without the head. The cfg says 0 classes too, else timm drops
                # the head from the weights and loads the rest non-strictly
                kwargs["pretrained_cfg_overlay"]["num_classes"] = 0
                module = timm.create_model(name, pretrained=True, num_classes=0, **kwargs)
                notes.append(f"backbone: the weights have no classifier head ({listed(head)}), so timm:{spec} was loaded "
                             "without one: no classes, no class maps")
        else:
            module = load_cached_or_fetch(
                lambda: timm.create_model(name, pretrained=True, **kwargs), f"timm:{name}",
                f"Load local weights with timm:{name}@/path/to/model.safetensors, or try the architecture with "
                f"timm:{name}@{RANDOM}.")
    except RuntimeError as error:
        message = str(error)
        if "Unknown model" in message.splitlines()[0]:
            raise VitExplorerError(f"timm has no model {name!r}; see timm.list_models()") from None
        if "state_dict" in message:
            raise load_error(spec, message, classifier_names(name)) from None
        raise VitExplorerError(f"timm could not load {name!r}: {message.splitlines()[0]}") from None
    except (OSError, ValueError) as error:
        raise VitExplorerError(
            f"could not fetch weights for timm:{name} ({str(error).splitlines()[0]}). Without network, load local weights "
            f"with timm:{name}@/path/to/model.safetensors, or fill the Hugging Face cache first"
        ) from None
    loaded = from_timm_module(module, f"timm:{spec}", input_hw)
    loaded.random_weights = random_weights
    loaded.notes += notes
    return loaded
