"""Hugging Face models from a spec: a hub repo or a local folder through transformers' own download and cache, or a
config with random weights; a model with an image and a text tower (CLIP, SigLIP) through ``hf_clip_adapter``."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torch import nn

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import HEAD_TOO, LoadedModel, listed
from vit_explorer.models.hf_adapter import from_hf_module, require_transformers
from vit_explorer.models.hf_clip_adapter import FULL_TYPES, from_hf_clip
from vit_explorer.models.hub import load_cached_or_fetch
from vit_explorer.models.swin_adapter import StageAdapter

RANDOM_SUFFIX = "@random"  # ``hf:CONFIG_FOLDER@random``: the architecture of a config with random weights


def newly_initialised(info: dict) -> list[str]:
    """The parameters ``from_pretrained`` had to initialise itself: missing from the weights or of another shape."""
    return sorted(set(info.get("missing_keys") or ()) | {entry[0] if isinstance(entry, tuple) else entry
                                                         for entry in info.get("mismatched_keys") or ()})


def head_parameters(module: nn.Module) -> set[str]:
    """The parameters of a task model that are not in its base model (the classifier head)."""
    prefix = f"{module.base_model_prefix}."
    return {name for name in module.state_dict() if not name.startswith(prefix)}


@contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' load report muted: it calls a missing head "newly initialized", which is not what happens here."""
    from transformers.utils import logging

    saved = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(saved)


def from_pretrained(cls, where: str, name: str, **options) -> tuple[nn.Module, list[str]]:
    """``cls.from_pretrained(where)`` in eager attention and the parameters it had to initialise itself."""
    try:
        module, info = cls.from_pretrained(where, attn_implementation="eager", output_loading_info=True, **options)
    except RuntimeError as error:  # weights of other shapes, which transformers refuses
        raise VitExplorerError(f"{name}: the weights do not fit {cls.__name__}: {' '.join(str(error).split())[:500]}") from None
    return module, newly_initialised(info)


def load_pretrained(auto, where: str, name: str) -> tuple[nn.Module, list[str]]:
    """``auto.from_pretrained(where)`` with every parameter from the weights (the module and its notes).

    transformers fills a parameter the weights lack with random values and only logs it. Here that is an
    error naming the parameters, except when all that is missing is the classifier head: the weights are
    a backbone's, and the model is loaded as that backbone, without classes.
    """
    with quiet_loading():
        module, fresh = from_pretrained(auto, where, name)
    head = head_parameters(module) if module is not module.base_model else set()
    notes = []
    if fresh and set(fresh) == head:
        backbone = type(module.base_model)
        # the pooler, like the head, is not in a backbone's weights, and the maps do not use it
        options = {"add_pooling_layer": False} if "add_pooling_layer" in inspect.signature(backbone.__init__).parameters else {}
        module, fresh = from_pretrained(backbone, where, name, **options)
        notes.append(f"backbone: the weights have no classifier head ({listed(sorted(head))}), so {name} was loaded without one: "
                     "no classes, no class maps")
    if fresh:
        lacking = sorted(set(fresh) - head) or fresh
        also = f" ({HEAD_TOO})" if head and head <= set(fresh) else ""
        raise VitExplorerError(
            f"{name}: the weights lack {len(lacking)} parameter(s) of {type(module).__name__}, which would be initialised at "
            f"random: {listed(lacking)}{also}. Load weights saved from this architecture, or {name}{RANDOM_SUFFIX} for an "
            f"explicitly random model"
        )
    return module, notes


def load_hf(source: str, input_hw: tuple[int, int] | None = None) -> LoadedModel:
    """A hub repo or local folder, through transformers' own download and cache (the local cache
    first), with eager attention; ``SOURCE@random`` builds the config's architecture with random weights.

    Every parameter comes from the weights (or the model is refused), except a missing classifier head:
    the model is then the backbone, without classes.
    """
    transformers = require_transformers()
    random_weights = source.endswith(RANDOM_SUFFIX)
    location = source.removesuffix(RANDOM_SUFFIX)
    local = Path(location).expanduser()
    where = str(local) if local.exists() else location

    def build() -> LoadedModel:
        last_error: Exception | None = None
        config = transformers.AutoConfig.from_pretrained(where) if random_weights else None
        if config is not None and config.architectures is None:
            # a config saved on its own names no architecture, and an Auto class's from_config then iterates None
            # (a TypeError from inside transformers for DeiT and LeViT): none named, the Auto class picks its default
            config.architectures = []
        if (config or transformers.AutoConfig.from_pretrained(where)).model_type in FULL_TYPES:  # an image and a text tower
            module = transformers.AutoModel.from_config(config, attn_implementation="eager") if config is not None else (
                load_pretrained(transformers.AutoModel, where, f"hf:{source}")[0])
            return from_hf_clip(module, f"hf:{source}", where, input_hw, random_weights)
        for auto in (transformers.AutoModelForImageClassification, transformers.AutoModel):
            try:
                if config is not None:
                    module, notes = auto.from_config(config, attn_implementation="eager"), []
                else:
                    module, notes = load_pretrained(auto, where, f"hf:{source}")
            except ValueError as error:  # not a model this Auto class knows: try the bare backbone
                last_error = error
                continue
            loaded = from_hf_module(module, f"hf:{source}", where, input_hw,
                                    StageAdapter() if StageAdapter.matches(module) else None)
            loaded.random_weights = random_weights
            loaded.notes = notes + loaded.notes  # what the weights lack first, then how they are run
            return loaded
        raise VitExplorerError(f"hf:{source} is not a vision model vit_explorer can capture ({last_error})")

    hint = "Without network, give a local folder saved with save_pretrained(): --model hf:/path/to/folder"
    try:
        return build() if local.exists() else load_cached_or_fetch(build, f"hf:{location}", hint)
    except OSError as error:
        raise VitExplorerError(f"could not load hf:{source} ({str(error).splitlines()[0]}). {hint}") from None
