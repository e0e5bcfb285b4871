"""Whether an image lies outside what a model knows: the energy score of its logits.

Liu et al. 2020 ("Energy-based Out-of-distribution Detection"): E(x) = −logsumexp(logits) (temperature 1).
A classifier gives the images it was trained on large logits, hence low energy; an unfamiliar image gets
higher energy. The threshold is a high quantile of the energies of held-out in-distribution images, so
that few of them are flagged. The calibration travels in the checkpoint's config (``"ood"``); a model
without one is never flagged.

The shipped shapes model first used the Mahalanobis distance of the class-token feature (Lee et al. 2018).
On that model it flagged 1 of 21 skimage pictures. Energy flagged 8, at the same rate of false flags on
shapes drawn by other code, so energy replaced it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vit_explorer.errors import VitExplorerError

THRESHOLD_QUANTILE = 0.99  # of held-out in-distribution energies: about 1 in 100 known images is flagged
SCORE = "energy"  # the config's "score": a calibration of another kind is not read (``from_config``)


def energy(logits: torch.Tensor) -> torch.Tensor:
    """The energy ``[b]`` float64 of logits ``[b, classes]``: −logsumexp over the classes (higher: less familiar)."""
    return -torch.logsumexp(logits.detach().double(), dim=-1).cpu()


@dataclass(frozen=True)
class OodCalibration:
    """The threshold on the energy, with what the model knows, shown when an image is flagged."""

    threshold: float
    known: str
    quantile: float = THRESHOLD_QUANTILE  # of the held-out energies the threshold was set at

    @classmethod
    def from_config(cls, config: dict) -> OodCalibration:
        """Read a checkpoint's ``"ood"`` entry (``calibrate``'s output); raises ``VitExplorerError`` for another kind."""
        if config.get("score") != SCORE:
            raise VitExplorerError(f"out-of-distribution calibration of kind {config.get('method', config.get('score'))!r}, "
                                   f"not {SCORE!r}: this version reads only the energy score")
        return cls(float(config["threshold"]), str(config.get("known", "")),
                   float(config.get("threshold_quantile", THRESHOLD_QUANTILE)))

    def verdict(self, logits: torch.Tensor) -> OodVerdict:
        """The verdict on one image's logits ``[classes]``."""
        return OodVerdict(float(energy(logits[None])[0]), self.threshold, self.known, self.quantile)


def calibrate(heldout_logits: torch.Tensor, known: str) -> dict:
    """The config entry (``"ood"``) from the logits ``[b, classes]`` of held-out in-distribution images."""
    heldout = energy(heldout_logits)
    return {"score": SCORE, "method": "energy score (Liu et al. 2020), temperature 1",
            "threshold": float(torch.quantile(heldout, THRESHOLD_QUANTILE)), "threshold_quantile": THRESHOLD_QUANTILE,
            "calibrated_on": len(heldout), "known": known}


@dataclass(frozen=True)
class OodVerdict:
    """One image's energy against its model's calibration."""

    score: float
    threshold: float
    known: str
    quantile: float = THRESHOLD_QUANTILE

    @property
    def flagged(self) -> bool:
        return self.score > self.threshold

    def domain(self, model_name: str) -> str:
        """The line beside every prediction of a model whose calibration states what it knows: a confident model
        can be wrong about its domain (the built-in model calls photos "ring" at 80–90%), so the energy notice
        alone cannot be the only warning."""
        return (f"{model_name} knows only {self.known}; on other images its class means nothing. For real images, load a "
                "real model (timm:NAME, hf:REPO or a checkpoint file).")

    def notice(self, model_name: str) -> str:
        """What a user reads when the image is flagged: what the model knows, and what to load instead."""
        score, threshold = distinguished(self.score, self.threshold)
        return (f"This image is unlike anything {model_name} was trained on (its energy score {score} is above "
                f"{threshold}, below which {self.quantile:.0%} of held-out known images stay). The model knows only "
                f"{self.known}, so its prediction and maps here say little about the image. For photos, load a real model: "
                "`timm:NAME` (e.g. timm:vit_base_patch16_224), `hf:REPO` (e.g. hf:google/vit-base-patch16-224) or a local "
                "checkpoint file.")


def distinguished(score: float, threshold: float) -> tuple[str, str]:
    """The score and the threshold with the decimals (2 to 6) that tell them apart, so that a notice never reads
    "-2.02 is above -2.02"."""
    for decimals in range(2, 7):
        shown = f"{score:.{decimals}f}", f"{threshold:.{decimals}f}"
        if shown[0] != shown[1]:
            return shown
    return shown
