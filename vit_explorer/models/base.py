"""The interface every model family implements: how to run it and where its attention appears."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import VitExplorerError
from ..layout import TokenLayout

if TYPE_CHECKING:  # ood reads features through capture, which needs this module
    from ..ood import OodCalibration

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


HEAD_TOO = "the classifier head is missing too; alone, that would load the model as a backbone"


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
    def attached(self, module: nn.Module, sink: MutableMapping[int, torch.Tensor]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """While active, the yielded function maps pixels ``[b, 3, H, W]`` to logits ``[b, classes]``
        and stores each layer's attention ``[b, heads, n, n]`` in ``sink[layer]``.

        Everything the adapter changed on the module (hooks, fused-attention switches) is undone
        on exit, also when the forward raised.
        """

    @abstractmethod
    def blocks(self, module: nn.Module) -> list[nn.Module]:
        """One module per transformer layer, in layer order, holding all of that layer's parameters."""

    def classifier(self, module: nn.Module) -> nn.Module | None:
        """The classifier head, whose input is the feature the out-of-distribution score reads (None: unknown)."""
        return None

    def logits(self, module: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels ``[b, 3, H, W]`` → logits ``[b, classes]`` by the model's normal forward, no capture
        (``[b, 0]`` for a backbone without a classifier head)."""
        return module(pixels)


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
    def attached(self, module: nn.Module, sink: MutableMapping[int, torch.Tensor]) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        hook_modules = self.softmax_modules(module)
        if not hook_modules:
            raise VitExplorerError(f"{type(module).__name__} has no attention layers that vit_explorer can capture")

        def store(layer: int, _module: nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
            sink[layer] = output

        handles = []
        try:
            with self.unfused(module):
                for layer, hook_module in enumerate(hook_modules):
                    handles.append(hook_module.register_forward_hook(partial(store, layer)))
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
    # statistics that tell when an image is outside what the model knows (``ood``); None: never flagged
    ood: OodCalibration | None = None
    random_weights: bool = False  # built with freshly initialised weights (``@random``): nothing learned

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def logits(self, pixels: torch.Tensor) -> torch.Tensor:
        """The normal forward without capture, under ``torch.inference_mode`` ``[b, classes]``."""
        with torch.inference_mode():
            return self.adapter.logits(self.module, pixels.to(self.device))
