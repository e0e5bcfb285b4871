"""Load a ViT checkpoint file: safetensors (preferred) or a weights-only ``.pt``, plus its config."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import IMAGENET_MEAN, IMAGENET_STD, LoadedModel, Preprocess, listed
from vit_explorer.models.ood import OodCalibration
from vit_explorer.models.vit_pytorch import VitPytorchAdapter, build_vit
from vit_explorer.models.word_text import TEXT_KEY, text_encoder, text_tower

CONFIG_KEY = "vit_explorer"
DOMAIN_KEY = "domain"  # what a shipped model was trained on, in words, for a model without an out-of-distribution score


def read_state_dict(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    """The tensors of a checkpoint and the config embedded in it, if any.

    ``.pt``/``.pth``/``.bin`` go through ``torch.load(weights_only=True)``: a pickle that would run
    code is refused, never executed.
    """
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
                tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        except (SafetensorError, OSError, ValueError) as error:
            raise VitExplorerError(f"{path}: not a readable safetensors file ({error})") from None
        embedded = json.loads(metadata[CONFIG_KEY]) if CONFIG_KEY in metadata else None
        return tensors, embedded
    if path.suffix in {".pt", ".pth", ".bin"}:
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:
            raise VitExplorerError(
                f"{path}: refused to load: the file holds Python objects other than tensors, which could run code "
                f"({str(error).splitlines()[0]}). Re-save it as safetensors or as a plain state_dict."
            ) from None
        except (RuntimeError, EOFError, OSError) as error:
            raise VitExplorerError(f"{path}: not a readable PyTorch checkpoint ({error})") from None
        if isinstance(loaded, dict) and isinstance(loaded.get("state_dict"), dict):
            return loaded["state_dict"], loaded.get(CONFIG_KEY) or loaded.get("config")
        if isinstance(loaded, dict) and all(isinstance(v, torch.Tensor) for v in loaded.values()):
            return loaded, None
        raise VitExplorerError(f"{path}: expected a state_dict (a dict of tensors), found {type(loaded).__name__}")
    raise VitExplorerError(f"{path}: unknown checkpoint type {path.suffix!r}; use .safetensors, .pt or .pth")


def read_config(path: Path, embedded: dict[str, Any] | None) -> dict[str, Any]:
    """The config embedded in the checkpoint, else the JSON beside it (``NAME.json`` or ``config.json``)."""
    if embedded is not None:
        return embedded
    for candidate in (path.with_suffix(".json"), path.parent / "config.json"):
        if candidate.is_file():
            try:
                return json.loads(candidate.read_text())
            except json.JSONDecodeError as error:
                raise VitExplorerError(f"{candidate}: not valid JSON ({error})") from None
    raise VitExplorerError(
        f"{path}: no config found: put the ViT arguments in {path.with_suffix('.json').name} beside it, "
        'e.g. {"vit": {"image_size": 224, "patch_size": 16, "num_classes": 10, "dim": 192, "depth": 6, "heads": 3, "mlp_dim": '
        '768}}'
    )


def load_strict(module: nn.Module, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """``load_state_dict(strict=True)`` with a message naming the parameters that do not fit."""
    expected = module.state_dict()
    missing = [name for name in expected if name not in state_dict]
    if missing:
        raise VitExplorerError(f"{source}: checkpoint lacks parameter(s) {listed(missing)} that the config's model has "
                               "(they would be initialised at random)")
    for name, tensor in expected.items():
        if state_dict[name].shape != tensor.shape:
            raise VitExplorerError(
                f"{source}: parameter {name!r} has shape {tuple(state_dict[name].shape)} in the checkpoint "
                f"but {tuple(tensor.shape)} in the model its config describes"
            )
    extra = sorted(set(state_dict) - set(expected))
    if extra:
        raise VitExplorerError(f"{source}: checkpoint has parameter(s) {listed(extra)} that the config's model lacks")
    module.load_state_dict(state_dict, strict=True)


def head_missing(module: nn.Module, state_dict: dict[str, torch.Tensor]) -> list[str]:
    """The classifier's parameters, when they are all that ``state_dict`` lacks (a backbone's weights); else []."""
    missing = [name for name in module.state_dict() if name not in state_dict]
    head = module.mlp_head
    head_names = [f"mlp_head.{name}" for name in head.state_dict()] if head is not None else []
    return missing if missing and missing == head_names else []


def load_vit_checkpoint(path: Path, name: str | None = None) -> LoadedModel:
    """A ViT (vit-pytorch layout) from a checkpoint and its config."""
    if not path.is_file():
        raise VitExplorerError(f"model file {path} does not exist")
    state_dict, embedded = read_state_dict(path)
    config = read_config(path, embedded)
    text = None
    if TEXT_KEY in config:  # a CLIP-like checkpoint: the ViT is its image tower, the text tower's tensors are under text.
        prefix = f"{TEXT_KEY}."
        encoder = text_encoder(config[TEXT_KEY], str(path))
        load_strict(encoder, {key.removeprefix(prefix): tensor for key, tensor in state_dict.items() if key.startswith(prefix)},
                    f"{path} (text tower)")
        text = text_tower(config[TEXT_KEY], encoder)
        state_dict = {key: tensor for key, tensor in state_dict.items() if not key.startswith(prefix)}
    vit_config = config.get("vit", config)
    module = build_vit(vit_config, str(path))
    head = head_missing(module, state_dict)
    if head:  # a backbone: build it without the head rather than with a random one
        vit_config = {**vit_config, "num_classes": 0}
        module = build_vit(vit_config, str(path))
    load_strict(module, state_dict, str(path))
    module.eval()
    labels = config.get("labels") if not head else None
    if labels is not None and len(labels) != vit_config["num_classes"]:
        raise VitExplorerError(f"{path}: {len(labels)} labels for {vit_config['num_classes']} classes")
    preprocess = Preprocess(
        input_hw=module.image_size,
        mean=tuple(config.get("mean", IMAGENET_MEAN)),
        std=tuple(config.get("std", IMAGENET_STD)),
        interpolation=config.get("interpolation", "bilinear"),
    )
    notes = [f"backbone: the checkpoint has no classifier head ({listed(head)}), so it was loaded without one: no classes, "
             "no class maps"] if head else []
    if DOMAIN_KEY in config:
        notes.append(str(config[DOMAIN_KEY]))
    ood = None
    if "ood" in config and not head:  # a calibration of the logits means nothing without the classifier
        try:
            ood = OodCalibration.from_config(config["ood"])
        except VitExplorerError as error:  # e.g. written by an earlier version of train-default
            notes.append(f"{error}, so no image is flagged as unfamiliar; `vit-explorer train-default` writes one it reads")
    adapter = VitPytorchAdapter()
    return LoadedModel(
        module=module,
        name=name or path.name,
        preprocess=preprocess,
        layout=adapter.layout(module, preprocess.input_hw),
        adapter=adapter,
        labels=list(labels) if labels is not None else None,
        ood=ood,
        notes=notes + (list(text.notes) if text is not None else []),
        text=text,
    )
