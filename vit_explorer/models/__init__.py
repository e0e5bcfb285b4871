"""Model loading: one adapter per family behind ``load_model(spec)``.

Specs: ``builtin:NAME`` (shipped in assets/), ``timm:NAME`` or ``timm:NAME@WEIGHTS`` (timm, optional
extra), ``hf:REPO_OR_FOLDER`` (transformers, optional extra; CLIP and SigLIP with their text towers),
``open_clip:ARCH@WEIGHTS`` (OpenCLIP, optional extra; WEIGHTS a file, a pretrained tag or ``random``), or a path
to a ``.safetensors``/``.pt`` checkpoint of a vit-pytorch ViT with its config.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import CaptureAdapter, LoadedModel, Preprocess
from vit_explorer.models.cait_adapter import CaitAdapter
from vit_explorer.models.hf_adapter import HFAdapter
from vit_explorer.models.hf_clip_adapter import HFTowerAdapter
from vit_explorer.models.open_clip_adapter import OpenClipAdapter
from vit_explorer.models.swin_adapter import StageAdapter
from vit_explorer.models.timm_adapter import TimmAdapter
from vit_explorer.models.vit_pytorch import VitPytorchAdapter

DEFAULT_MODEL = "builtin:shapes"
ADAPTERS: list[type[CaptureAdapter]] = [VitPytorchAdapter, TimmAdapter, CaitAdapter, StageAdapter, HFAdapter, HFTowerAdapter,
                                        OpenClipAdapter]
CHECKPOINT_SUFFIXES = {".safetensors", ".pt", ".pth", ".bin"}


def adapter_for(module: nn.Module) -> CaptureAdapter:
    """The capture adapter of the family ``module`` belongs to."""
    for adapter in ADAPTERS:
        if adapter.matches(module):
            return adapter()
    raise VitExplorerError(f"vit_explorer does not know how to capture attention from a {type(module).__name__}")


STAGE_MARK = "#stage="  # ``SPEC#stage=K``: stage K of a model with stages (a Swin's grids); without it, stage 0


def stage_view(model: LoadedModel, stage: int) -> LoadedModel:
    """``model`` read at stage ``stage`` (``CaptureAdapter.num_stages``: a Swin's grids), named ``SPEC#stage=K``: the
    same module, that stage's layers, heads and grid."""
    adapter = model.adapter.at_stage(model.module, stage)
    if adapter is model.adapter:
        return model
    notes = [note for note in model.notes if note not in model.adapter.family_notes(model.module)]
    return replace(model, adapter=adapter, layout=adapter.layout(model.module, model.preprocess.input_hw),
                   name=f"{model.name.partition(STAGE_MARK)[0]}{STAGE_MARK}{stage}",
                   notes=adapter.family_notes(model.module) + notes)


def stage_specs(model: LoadedModel) -> list[str]:
    """The spec of each stage of ``model`` (``SPEC#stage=K``); none for a model with one grid."""
    stages = model.adapter.num_stages(model.module)
    base = model.name.partition(STAGE_MARK)[0]
    return [f"{base}{STAGE_MARK}{stage}" for stage in range(stages)] if stages > 1 else []


def default_device() -> torch.device:
    """The GPU when there is one (maps come back to the CPU once per analysis), else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_model(spec: str = DEFAULT_MODEL, input_hw: tuple[int, int] | None = None,
               device: str | torch.device | None = None) -> LoadedModel:
    """Load a model by spec onto ``device`` (default: ``default_device()``); ``input_hw`` asks for
    another input size where the family allows it. ``SPEC#stage=K`` reads stage K of a model with stages (a Swin)."""
    from vit_explorer.models.builtin import load_builtin
    from vit_explorer.models.checkpoint import load_vit_checkpoint
    from vit_explorer.models.hf_loading import load_hf
    from vit_explorer.models.open_clip_adapter import load_open_clip
    from vit_explorer.models.timm_loading import load_timm

    try:
        target = torch.device(device) if device is not None else default_device()
    except RuntimeError as error:
        raise VitExplorerError(f"unknown device {device!r}: {error}") from None
    if target.type == "cuda" and not torch.cuda.is_available():
        raise VitExplorerError(f"device {device!r} was asked for, but torch sees no CUDA GPU here; use --device cpu")
    base, marked, stage = spec.partition(STAGE_MARK)
    if marked:
        if not stage.isdigit():
            raise VitExplorerError(f"{spec!r}: a stage is a number, as in {base}{STAGE_MARK}1")
        return stage_view(load_model(base, input_hw, device), int(stage))
    prefix, _, rest = spec.partition(":")
    if prefix == "builtin" and rest:
        loaded = fixed_size(load_builtin(rest), input_hw)
    elif prefix == "timm" and rest:
        loaded = load_timm(rest, input_hw)
    elif prefix == "hf" and rest:
        loaded = load_hf(rest, input_hw)
    elif prefix == "open_clip" and rest:
        loaded = fixed_size(load_open_clip(rest), input_hw)
    elif Path(spec).expanduser().suffix in CHECKPOINT_SUFFIXES:
        loaded = fixed_size(load_vit_checkpoint(Path(spec).expanduser()), input_hw)
    else:
        raise VitExplorerError(
            f"unknown model spec {spec!r}: use {DEFAULT_MODEL}, timm:NAME, hf:REPO_OR_FOLDER, open_clip:ARCH@WEIGHTS, "
            "or a path to a .safetensors/.pt checkpoint with its config"
        )
    loaded.module.to(target)
    if loaded.text is not None and loaded.text.module is not None:
        loaded.text.module.to(target)
    return loaded


def fixed_size(loaded: LoadedModel, input_hw: tuple[int, int] | None) -> LoadedModel:
    """``loaded``, if ``input_hw`` is its own size: this project's ViT cannot resize its position embeddings."""
    if input_hw is not None and tuple(input_hw) != loaded.preprocess.input_hw:
        raise VitExplorerError(f"{loaded.name} has learned position embeddings for {loaded.preprocess.input_hw}; it cannot "
                               f"take {input_hw}")
    return loaded


__all__ = ["DEFAULT_MODEL", "CaptureAdapter", "LoadedModel", "Preprocess", "adapter_for", "default_device", "load_model",
           "stage_view"]
