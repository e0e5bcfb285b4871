"""Models shipped in ``assets/`` (installed as ``vit_explorer.assets``): ``builtin:NAME`` is ``NAME.safetensors``."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import LoadedModel
from vit_explorer.models.checkpoint import load_vit_checkpoint

# installs unpack packages as folders, so the data package is a real directory
ASSETS = Path(str(files("vit_explorer.assets")))
EXAMPLES = ASSETS / "examples"


def builtin_names() -> list[str]:
    return sorted(path.stem for path in ASSETS.glob("*.safetensors"))


def load_builtin(name: str) -> LoadedModel:
    path = ASSETS / f"{name}.safetensors"
    if not path.is_file():
        known = ", ".join(f"builtin:{known}" for known in builtin_names()) or "none"
        raise VitExplorerError(f"no built-in model {name!r} (known: {known})")
    return load_vit_checkpoint(path, name=f"builtin:{name}")
