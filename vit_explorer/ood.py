"""Whether an image lies outside what a model knows: Mahalanobis distance of the class-token feature.

Lee et al. 2018 ("A Simple Unified Framework for Detecting Out-of-Distribution Samples"): fit one
Gaussian per class with a shared covariance to the final class-token features of training images;
an image's score is its squared Mahalanobis distance to the nearest class mean. The threshold is a
high quantile of the scores of held-out in-distribution images, so that few of them are flagged.
The fitted statistics travel in the checkpoint's config (``"ood"``); a model without them is never flagged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .capture import recording_inputs

THRESHOLD_QUANTILE = 0.99  # of held-out in-distribution scores: about 1 in 100 known images is flagged
SHRINKAGE = 1e-3  # added to the covariance's diagonal, relative to its mean variance


@dataclass(frozen=True)
class OodCalibration:
    """Class means ``[classes, dim]``, the shared precision matrix ``[dim, dim]`` and the threshold on the
    squared distance, with the description shown when an image is flagged."""

    means: np.ndarray
    precision: np.ndarray
    threshold: float
    known: str

    @classmethod
    def from_config(cls, config: dict) -> OodCalibration:
        return cls(np.asarray(config["means"], dtype=np.float64), np.asarray(config["precision"], dtype=np.float64),
                   float(config["threshold"]), str(config.get("known", "")))

    def scores(self, features: np.ndarray) -> np.ndarray:
        """Squared Mahalanobis distance of each feature ``[b, dim]`` to its nearest class mean, ``[b]``."""
        offsets = np.asarray(features, dtype=np.float64)[:, None, :] - self.means[None]  # [b, classes, dim]
        return np.einsum("bcd,de,bce->bc", offsets, self.precision, offsets).min(axis=1)

    def verdict(self, feature: np.ndarray) -> OodVerdict:
        """The verdict on one image's feature ``[dim]``."""
        return OodVerdict(float(self.scores(np.asarray(feature)[None])[0]), self.threshold, self.known)


def classifier_features(model: nn.Module, head: nn.Module, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``[b, classes]`` and the classifier's input features ``[b, dim]`` from one forward pass."""
    with recording_inputs(head) as seen:
        logits = model(pixels)
    return logits, seen[0]


def fit_mahalanobis(model: nn.Module, head: nn.Module, to_batch: Callable[[np.ndarray], torch.Tensor], images: np.ndarray,
                    labels: np.ndarray, heldout: np.ndarray, known: str, batch_size: int = 100) -> dict:
    """The config entry (``"ood"``) fitted on ``images``/``labels`` and calibrated on ``heldout`` (uint8 ``[b, H, W, 3]``)."""

    def features_of(batch_images: np.ndarray) -> np.ndarray:
        parts = []
        with torch.inference_mode():
            for start in range(0, len(batch_images), batch_size):
                parts.append(classifier_features(model, head, to_batch(batch_images[start : start + batch_size]))[1].numpy())
        return np.concatenate(parts)

    features = features_of(images)
    classes = int(labels.max()) + 1
    means = np.stack([features[labels == c].mean(axis=0) for c in range(classes)])
    centred = features - means[labels]
    covariance = centred.T @ centred / len(features)
    covariance += np.eye(len(covariance)) * SHRINKAGE * np.trace(covariance) / len(covariance)
    precision = np.linalg.inv(covariance)
    partial = OodCalibration(means, precision, np.inf, known)
    heldout_scores = partial.scores(features_of(heldout))
    return {"method": "mahalanobis (Lee et al. 2018), shared covariance, class-token feature",
            "means": means.tolist(), "precision": precision.tolist(),
            "threshold": float(np.quantile(heldout_scores, THRESHOLD_QUANTILE)), "threshold_quantile": THRESHOLD_QUANTILE,
            "fitted_on": len(features), "calibrated_on": len(heldout_scores), "known": known}


@dataclass(frozen=True)
class OodVerdict:
    """One image's score against its model's calibration."""

    score: float
    threshold: float
    known: str

    @property
    def flagged(self) -> bool:
        return self.score > self.threshold

    def notice(self, model_name: str) -> str:
        """What a user reads when the image is flagged: what the model knows, and what to load instead."""
        return (f"This image is unlike anything {model_name} was trained on (out-of-distribution score {self.score:.0f}, "
                f"threshold {self.threshold:.0f}). The model knows only {self.known}, so its prediction and maps here "
                "say little about the image. For photos, load a real model: `timm:NAME` (e.g. timm:vit_base_patch16_224), "
                "`hf:REPO` (e.g. hf:google/vit-base-patch16-224) or a local checkpoint file.")
