"""Ground-truth checks of attention on the generated shapes: accuracy, pointing game, energy.

Pure math over maps and masks, plus one function that runs them for a model on a held-out set.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from .capture import record_attention
from .layout import TokenLayout
from .models.base import LoadedModel
from .rollout import rollout_factors, rollout_rows
from .shapes import Sample, generate_set


def patch_mask(mask: np.ndarray, grid_hw: tuple[int, int], dilate: int = 1) -> np.ndarray:
    """Pixel mask ``[H, W]`` → patches touching the object ``[grid_h, grid_w]``, grown by ``dilate`` patches."""
    rows, cols = grid_hw
    touched = mask.reshape(rows, mask.shape[0] // rows, cols, mask.shape[1] // cols).any(axis=(1, 3))
    grown = touched.copy()
    for dy in range(-dilate, dilate + 1):
        for dx in range(-dilate, dilate + 1):
            shifted = np.zeros_like(touched)
            shifted[max(dy, 0) : rows + min(dy, 0), max(dx, 0) : cols + min(dx, 0)] = touched[max(-dy, 0) : rows - max(dy, 0), max(-dx, 0) : cols - max(dx, 0)]
            grown |= shifted
    return grown


def pointing_hit(grid_map: np.ndarray, target: np.ndarray) -> bool:
    """Whether the map's maximum ``[grid_h, grid_w]`` falls on a target patch."""
    return bool(target.flat[int(np.argmax(grid_map))])


def energy(grid_map: np.ndarray, target: np.ndarray) -> float:
    """Share of the map's (non-negative) mass on the target patches."""
    mass = np.clip(grid_map, 0, None)
    return float(mass[target].sum() / max(mass.sum(), 1e-12))


@dataclass(frozen=True)
class GroundTruthFigures:
    images: int
    accuracy: float
    pointing_rollout: float
    pointing_last_layer: float
    pointing_random: float
    energy_rollout: float
    energy_last_layer: float
    target_share: float  # the dilated mask's share of the patches: the energy of a uniform map

    def as_dict(self) -> dict:
        return asdict(self)


def evaluate_on_shapes(model: LoadedModel, samples: list[Sample], batch_size: int = 50, seed: int = 0) -> GroundTruthFigures:
    """Accuracy, and pointing game and energy of the class-token rollout, of the last layer's mean
    class-token attention and of a uniform random map, against each object's mask dilated by one patch."""
    from .images import to_pixels

    layout: TokenLayout = model.layout
    rng = np.random.default_rng(seed)
    correct, hits, energies = 0, {"rollout": 0, "last": 0, "random": 0}, {"rollout": [], "last": []}
    shares = []
    for start in range(0, len(samples), batch_size):
        batch = samples[start : start + batch_size]
        pixels = torch.cat([to_pixels(sample.image, model.preprocess) for sample in batch]).to(model.device)
        logits, attentions = record_attention(model, pixels)
        correct += int((logits.argmax(-1).cpu().numpy() == np.array([s.label for s in batch])).sum())
        for sample, maps in zip(batch, attentions.float().cpu()):
            target = patch_mask(sample.mask, layout.grid_hw)
            query = torch.zeros(1, layout.num_tokens)
            query[0, 0] = 1.0
            rollout = layout.patch_map(rollout_rows(rollout_factors(maps), query)[0].numpy())
            last = layout.patch_map(maps[-1, :, 0, :].mean(0).numpy())
            for name, grid_map in (("rollout", rollout), ("last", last), ("random", rng.random(layout.grid_hw))):
                hits[name] += pointing_hit(grid_map, target)
            energies["rollout"].append(energy(rollout, target))
            energies["last"].append(energy(last, target))
            shares.append(float(target.mean()))
    count = len(samples)
    return GroundTruthFigures(
        images=count,
        accuracy=correct / count,
        pointing_rollout=hits["rollout"] / count,
        pointing_last_layer=hits["last"] / count,
        pointing_random=hits["random"] / count,
        energy_rollout=float(np.mean(energies["rollout"])),
        energy_last_layer=float(np.mean(energies["last"])),
        target_share=float(np.mean(shares)),
    )


def heldout_figures(model: LoadedModel, count: int = 200) -> GroundTruthFigures:
    """The figures on the first ``count`` images of the fixed held-out set (never trained on)."""
    from .train import HELDOUT_SEED

    return evaluate_on_shapes(model, generate_set(HELDOUT_SEED, count))
