"""``analyze``: one image through one model, captured once, kept as CPU arrays for every view."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .capture import record_attention
from .images import ImageSource, load_image, model_view, to_pixels
from .layout import TokenLayout
from .models.base import LoadedModel


@dataclass(frozen=True)
class Prediction:
    index: int
    label: str
    prob: float


@dataclass
class Analysis:
    """Everything the views need for one (image, model) pair; holds no reference to the model.

    Attributes:
        image: the image as the model saw it ``[H, W, 3]`` uint8.
        attentions: softmax attention of every layer and head ``[layers, heads, n, n]`` float32.
        logits: ``[classes]``.
        layout: token layout (prefix tokens, patch grid).
        labels: class names, or None when the model has none.
        model_name: the spec the model was loaded from.
    """

    image: np.ndarray
    attentions: np.ndarray
    logits: np.ndarray
    layout: TokenLayout
    labels: list[str] | None
    model_name: str
    # arrays that views derive and reuse (rollout factors, query rows, statistics), bounded
    derived: OrderedDict[tuple, Any] = field(default_factory=OrderedDict, repr=False, compare=False)
    derived_limit: ClassVar[int] = 32

    @property
    def grid(self) -> tuple[int, int]:
        return self.layout.grid_hw

    @property
    def num_prefix_tokens(self) -> int:
        return self.layout.num_prefix_tokens

    @property
    def probs(self) -> np.ndarray:
        """Class probabilities ``[classes]``; empty for a backbone without a classifier head."""
        if self.logits.size == 0:
            return self.logits
        shifted = np.exp(self.logits - self.logits.max())
        return shifted / shifted.sum()

    def label(self, index: int) -> str:
        return self.labels[index] if self.labels is not None else f"class {index}"

    def top_k(self, k: int = 5) -> list[Prediction]:
        probs = self.probs
        order = np.argsort(-probs)[:k]
        return [Prediction(int(i), self.label(int(i)), float(probs[i])) for i in order]

    @property
    def nbytes(self) -> int:
        return self.image.nbytes + self.attentions.nbytes + self.logits.nbytes


def analyze(model: LoadedModel, image: ImageSource, name: str | None = None) -> Analysis:
    """Decode ``image``, resize it to the model's input, capture every layer's attention once."""
    view = model_view(load_image(image, name), model.preprocess)
    pixels = to_pixels(view, model.preprocess).to(model.device)
    logits, attentions = record_attention(model, pixels)
    attentions = attentions[0].float().cpu().numpy()  # [layers, heads, n, n]
    model.layout.validate(attentions.shape[-1])
    return Analysis(
        image=view,
        attentions=np.ascontiguousarray(attentions),
        logits=logits[0].float().cpu().numpy(),
        layout=model.layout,
        labels=model.labels,
        model_name=model.name,
    )


__all__ = ["Analysis", "Prediction", "analyze"]
