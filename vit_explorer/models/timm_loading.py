"""Loading timm models: ``timm:NAME``, ``timm:NAME@FILE`` and ``timm:NAME@random``, and the adapter each family takes
(a plain ViT's, CaiT's, or a Swin stage's)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch
from torch import nn

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import HEAD_TOO, LoadedModel, Preprocess, listed
from vit_explorer.models.cait_adapter import CaitAdapter
from vit_explorer.models.hub import load_cached_or_fetch
from vit_explorer.models.layout import check_input_hw
from vit_explorer.models.refusals import unreadable
from vit_explorer.models.swin_adapter import StageAdapter
from vit_explorer.models.timm_adapter import TimmAdapter, attention_modules, require_timm

TIMM_ADAPTERS = (TimmAdapter, CaitAdapter, StageAdapter)


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
    timm = require_timm()
    adapter = next((kind() for kind in TIMM_ADAPTERS if kind.matches(module)), None)
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
                 "and CaiT and Swin")
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
