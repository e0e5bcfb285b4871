"""Model loading: one adapter per family behind ``load_model(spec)``.

Specs: ``builtin:NAME`` (shipped in assets/), ``timm:NAME`` or ``timm:NAME@WEIGHTS`` (timm, optional
extra), ``hf:REPO_OR_FOLDER`` (transformers, optional extra), or a path to a ``.safetensors``/``.pt``
checkpoint of a vit-pytorch ViT with its config.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from ..errors import VitExplorerError
from .base import CaptureAdapter, LoadedModel, Preprocess
from .hf_adapter import HFAdapter
from .timm_adapter import TimmAdapter
from .vit_pytorch import VitPytorchAdapter

DEFAULT_MODEL = "builtin:shapes"
ADAPTERS: list[type[CaptureAdapter]] = [VitPytorchAdapter, TimmAdapter, HFAdapter]
CHECKPOINT_SUFFIXES = {".safetensors", ".pt", ".pth", ".bin"}


def adapter_for(module: nn.Module) -> CaptureAdapter:
    """The capture adapter of the family ``module`` belongs to."""
    for adapter in ADAPTERS:
        if adapter.matches(module):
            return adapter()
    raise VitExplorerError(f"vit_explorer does not know how to capture attention from a {type(module).__name__}")


def load_model(spec: str = DEFAULT_MODEL, input_hw: tuple[int, int] | None = None) -> LoadedModel:
    """Load a model by spec; ``input_hw`` asks for another input size where the family allows it."""
    from .builtin import load_builtin
    from .checkpoint import load_vit_checkpoint
    from .hf_adapter import load_hf
    from .timm_adapter import load_timm

    prefix, _, rest = spec.partition(":")
    if prefix == "builtin" and rest:
        loaded = load_builtin(rest)
    elif prefix == "timm" and rest:
        return load_timm(rest, input_hw)
    elif prefix == "hf" and rest:
        return load_hf(rest, input_hw)
    elif Path(spec).expanduser().suffix in CHECKPOINT_SUFFIXES:
        loaded = load_vit_checkpoint(Path(spec).expanduser())
    else:
        raise VitExplorerError(
            f"unknown model spec {spec!r}: use {DEFAULT_MODEL}, timm:NAME, hf:REPO_OR_FOLDER, "
            "or a path to a .safetensors/.pt checkpoint with its config"
        )
    if input_hw is not None and tuple(input_hw) != loaded.preprocess.input_hw:
        raise VitExplorerError(f"{spec} has learned position embeddings for {loaded.preprocess.input_hw}; it cannot take {input_hw}")
    return loaded


__all__ = ["CaptureAdapter", "LoadedModel", "Preprocess", "DEFAULT_MODEL", "adapter_for", "load_model"]
