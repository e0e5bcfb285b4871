"""Model loading: one adapter per family behind ``load_model(spec)``.

Specs: ``builtin:NAME`` (shipped in assets/), a path to a ``.safetensors``/``.pt`` checkpoint with its
config. Families that need optional packages plug in here as further prefixes.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from ..errors import VitExplorerError
from .base import CaptureAdapter, LoadedModel, Preprocess
from .vit_pytorch import VitPytorchAdapter

DEFAULT_MODEL = "builtin:shapes"
ADAPTERS: list[type[CaptureAdapter]] = [VitPytorchAdapter]


def adapter_for(module: nn.Module) -> CaptureAdapter:
    """The capture adapter of the family ``module`` belongs to."""
    for adapter in ADAPTERS:
        if adapter.matches(module):
            return adapter()
    raise VitExplorerError(f"vit_explorer does not know how to capture attention from a {type(module).__name__}")


def load_model(spec: str = DEFAULT_MODEL) -> LoadedModel:
    """Load a model by spec: ``builtin:NAME`` or a checkpoint path."""
    from .builtin import load_builtin
    from .checkpoint import load_vit_checkpoint

    prefix, _, rest = spec.partition(":")
    if prefix == "builtin" and rest:
        return load_builtin(rest)
    path = Path(spec).expanduser()
    if path.suffix in {".safetensors", ".pt", ".pth", ".bin"}:
        return load_vit_checkpoint(path)
    raise VitExplorerError(
        f"unknown model spec {spec!r}: use {DEFAULT_MODEL}, or a path to a .safetensors/.pt checkpoint with its config"
    )


__all__ = ["CaptureAdapter", "LoadedModel", "Preprocess", "DEFAULT_MODEL", "adapter_for", "load_model"]
