"""Ground-truth checks of attention: accuracy, pointing game, energy, and deletion/insertion over a set of images.

Pure math over maps and masks, plus functions that run a model on a held-out set and score the
maps the app shows (``maps.class_map``) against each object's mask and by deletion / insertion.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from statistics import fmean

import numpy as np
import torch

from vit_explorer.core import relevance
from vit_explorer.core.analysis import Analysis, ClassEvidence, class_evidence, method_maps
from vit_explorer.core.capture import TOP, StackingSink, capture
from vit_explorer.core.curves import BLUR, Protocol, area_under
from vit_explorer.core.maps import CLASS_METHODS, RolloutOptions, class_map
from vit_explorer.methods.faithfulness import deletion_insertion
from vit_explorer.models.base import LoadedModel


def patch_mask(mask: np.ndarray, grid_hw: tuple[int, int], dilate: int = 1) -> torch.Tensor:
    """Pixel mask ``[H, W]`` bool (a picture, like the image) → patches touching the object ``[grid_h, grid_w]``
    bool, grown by ``dilate`` patches."""
    rows, cols = grid_hw
    touched = torch.from_numpy(mask).reshape(rows, mask.shape[0] // rows, cols, mask.shape[1] // cols).any(dim=3).any(dim=1)
    # a max over each (2·dilate + 1)² neighbourhood, padded with -inf: the border clips, it does not wrap round
    grown = torch.nn.functional.max_pool2d(touched[None, None].float(), 2 * dilate + 1, stride=1, padding=dilate)
    return grown[0, 0] > 0


def pointing_hit(grid_map: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether the map's maximum ``[grid_h, grid_w]`` falls on a target patch."""
    return bool(target.flatten()[grid_map.argmax()])


def mask_energy(grid_map: torch.Tensor, target: torch.Tensor) -> float:
    """Share of the map's (non-negative) mass on the target patches."""
    mass = grid_map.clamp_min(0)
    return float(mass[target].sum() / max(float(mass.sum()), 1e-12))


@dataclass(frozen=True)
class GroundTruthFigures:
    """Accuracy, and per map method (``maps.CLASS_METHODS``, plus ``random``) the pointing-game hit
    rate and the mean energy on the object, for the true class of each image."""

    images: int
    accuracy: float
    pointing: dict[str, float]
    energy: dict[str, float]
    target_share: float  # the dilated mask's share of the patches: the energy of a uniform map

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class FaithfulnessFigures:
    """Mean deletion and insertion AUCs per map method, and of random orders, over a set of images."""

    images: int
    steps: int
    auc: dict[str, dict[str, float]]  # method → {deletion, insertion}; "random" → the random orders' AUCs

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Labelled:
    """An image as the model sees it ``[H, W, 3]`` uint8, its class (-1: unknown, the top prediction is
    scored), and its object's mask ``[H, W]`` bool (None: no mask). ``shapes.Sample`` is one too. An image of
    several labelled objects has them in ``objects``, each (class, mask ``[H, W]`` bool): the class-sensitive
    pointing game asks each class's map to peak on its own object."""

    image: np.ndarray
    label: int
    mask: np.ndarray | None = None
    objects: tuple[tuple[int, np.ndarray], ...] = ()


def sample_analyses(model: LoadedModel, samples: Sequence[Labelled], batch_size: int = 50, methods: Sequence[str] = ()
                    ) -> Iterator[tuple[Labelled, Analysis, ClassEvidence | None]]:
    """Each sample's analysis and the class evidence for its true class (its top class when the label is
    unknown; None for a backbone without a classifier head, whose labels must be unknown), from one forward
    and backward pass per batch, with the maps of ``methods`` that take passes of their own; the maps then come from
    the same ``maps`` the app shows."""
    from vit_explorer.core.images import to_pixels

    for start in range(0, len(samples), batch_size):
        batch = samples[start : start + batch_size]
        pixels = torch.cat([to_pixels(sample.image, model.preprocess) for sample in batch]).to(model.device)
        labels = torch.tensor([sample.label for sample in batch])
        captured = capture(model, pixels, StackingSink(model.map_shape[0]), target=TOP if (labels < 0).all() else labels,
                           reduce_gradients=relevance.layer_evidence)
        targets = captured.targets
        for index, (sample, sample_logits,
                    maps) in enumerate(zip(batch, captured.logits.float().cpu(), captured.kept.float().cpu(), strict=True)):
            analysis = Analysis(image=sample.image, attentions=maps, logits=sample_logits, layout=model.layout,
                                labels=model.labels, model_name=model.name)
            if targets is None:
                yield sample, analysis, None
                continue
            target = int(targets[index])
            own_maps = method_maps(model, pixels[index : index + 1], target, methods)
            yield sample, analysis, ClassEvidence.from_layers(target, captured.gradients, image=index, method_maps=own_maps)


def evaluate_on_shapes(model: LoadedModel, samples: Sequence[Labelled], batch_size: int = 50,
                       seed: int = 0) -> GroundTruthFigures:
    """Accuracy, and pointing game and energy of every map method (default rollout options) and of a
    uniform random map, against each object's mask dilated by one patch."""
    rng = np.random.default_rng(seed)  # numpy's generator: a seed gives the random maps of the published figures
    correct, shares = 0, []
    hits, energies = {name: 0 for name in (*CLASS_METHODS, "random")}, {name: [] for name in CLASS_METHODS}
    for sample, analysis, evidence in sample_analyses(model, samples, batch_size, methods=tuple(CLASS_METHODS)):
        correct += int(analysis.logits.argmax() == sample.label)
        target = patch_mask(sample.mask, model.layout.grid_hw)
        hits["random"] += pointing_hit(torch.from_numpy(rng.random(model.layout.grid_hw)), target)
        for method in CLASS_METHODS:
            grid_map = class_map(analysis, method, evidence, RolloutOptions())
            hits[method] += pointing_hit(grid_map, target)
            energies[method].append(mask_energy(grid_map, target))
        shares.append(float(target.float().mean()))
    count = len(samples)
    return GroundTruthFigures(
        images=count,
        accuracy=correct / count,
        pointing={name: hit / count for name, hit in hits.items()},
        energy={name: fmean(values) for name, values in energies.items()},
        target_share=fmean(shares),
    )


def faithfulness_on_shapes(
    model: LoadedModel, samples: Sequence[Labelled], methods: tuple[str, ...] = tuple(CLASS_METHODS), steps: int = 10,
                           random_orders: int = 1
) -> FaithfulnessFigures:
    """Mean deletion / insertion AUCs of each method's map for each image's true class, and of random orders."""
    aucs: dict[str, list] = {name: [] for name in (*methods, "random")}
    for index, (sample, analysis, evidence) in enumerate(sample_analyses(model, samples, methods=methods)):
        for method in methods:
            curves = deletion_insertion(model, analysis.image, class_map(analysis, method, evidence, RolloutOptions()),
                                        sample.label,
                                        steps=steps, random_orders=random_orders, seed=index)
            aucs[method].append([curves.aucs["deletion"], curves.aucs["insertion"]])
        aucs["random"].append([curves.aucs["random_deletion"], curves.aucs["random_insertion"]])
    return FaithfulnessFigures(images=len(samples), steps=steps,
                               auc={name: {"deletion": fmean(pair[0] for pair in values),
                                           "insertion": fmean(pair[1] for pair in values)}
                                    for name, values in aucs.items()})


SCORES = ("deletion", "insertion", "deletion_relative", "insertion_relative", "perturbation", "pointing", "energy",
          "class_pointing")


def class_sensitive_hit(maps_by_class: Sequence[torch.Tensor], objects: Sequence[tuple[int, np.ndarray]],
                        grid_hw: tuple[int, int]) -> bool:
    """Whether the map of each object's class ``[grid_h, grid_w]`` peaks on a patch of that object (not grown: the two
    objects of a generated pair lie two patches apart, so the patches they touch are their own)."""
    return all(pointing_hit(grid_map, patch_mask(mask, grid_hw, dilate=0)) for grid_map,
               (_, mask) in zip(maps_by_class, objects, strict=True))


def score_images(model: LoadedModel, items: Iterable[Labelled], methods: tuple[str, ...], *, steps: int = 10,
                 random_orders: int = 1, protocol: Protocol = BLUR, batch_size: int = 16, seed: int = 0,
                 step: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Per-image figures, each a list in the order of ``items``: ``METHOD/deletion`` and ``METHOD/insertion``
    (AUC of the target probability), ``METHOD/deletion_relative`` and ``METHOD/insertion_relative`` (the same
    over the unperturbed image's probability of the target, so that 1 is "as sure as on the whole image" on any
    model, also on a random one whose probabilities are all near 1/classes), ``METHOD/perturbation`` (area under the deletion
    curve of "the target is
    still the top class": averaged over a labelled set, the positive-perturbation accuracy AUC of Chefer et
    al. 2021, lower is better), ``METHOD/pointing`` and ``METHOD/energy`` against the mask dilated by one patch
    (NaN without a mask), ``METHOD/class_pointing`` on an image of several labelled objects (else NaN): 1 when the
    map for each object's class peaks on that object (``class_sensitive_hit``; a class-agnostic map, the same for
    every class, can hardly score); the same for ``random`` orders (and a random map's pointing, a map drawn
    per class for class pointing), and ``correct`` (NaN where the label is unknown). The random orders and map of the i-th
    item are seeded ``seed + i``, so scoring
    a list in blocks, each with ``seed`` at its block's start, gives the figures of one run. ``step`` is called after
    each image (a progress bar's advance)."""
    scores: dict[str, list[float]] = {f"{method}/{score}": [] for method in (*methods, "random") for score in SCORES}
    scores["correct"] = []
    batch: list[Labelled] = []
    index = 0

    def flush() -> None:
        nonlocal index
        for sample, analysis, evidence in sample_analyses(model, batch, batch_size, methods=methods):
            scores["correct"].append(math.nan if sample.label < 0 else float(int(analysis.logits.argmax()) == sample.label))
            target = None if sample.mask is None else patch_mask(sample.mask, model.layout.grid_hw)
            for method in methods:
                grid_map = class_map(analysis, method, evidence, RolloutOptions())
                curves = deletion_insertion(model, analysis.image, grid_map, evidence.target, steps=steps,
                                            random_orders=random_orders,
                                            protocol=protocol, seed=seed + index)
                aucs = curves.aucs
                relative = curves.relative_aucs
                scores[f"{method}/deletion"].append(aucs["deletion"])
                scores[f"{method}/insertion"].append(aucs["insertion"])
                scores[f"{method}/deletion_relative"].append(relative["deletion"])
                scores[f"{method}/insertion_relative"].append(relative["insertion"])
                scores[f"{method}/perturbation"].append(area_under(curves.fractions, curves.deletion_top1))
                scores[f"{method}/pointing"].append(math.nan if target is None else float(pointing_hit(grid_map, target)))
                scores[f"{method}/energy"].append(math.nan if target is None else mask_energy(grid_map, target))
                if len(sample.objects) > 1:
                    by_class = [class_map(analysis, method, class_evidence(model, analysis, label, (method,)), RolloutOptions())
                                for label, _ in sample.objects]
                    hit = class_sensitive_hit(by_class, sample.objects, model.layout.grid_hw)
                    scores[f"{method}/class_pointing"].append(float(hit))
                else:
                    scores[f"{method}/class_pointing"].append(math.nan)
            scores["random/deletion"].append(aucs["random_deletion"])
            scores["random/insertion"].append(aucs["random_insertion"])
            scores["random/deletion_relative"].append(relative["random_deletion"])
            scores["random/insertion_relative"].append(relative["random_insertion"])
            scores["random/perturbation"].append(area_under(curves.fractions, curves.random_deletion_top1))
            random_map = torch.from_numpy(np.random.default_rng(seed + index).random(model.layout.grid_hw))
            scores["random/pointing"].append(math.nan if target is None else float(pointing_hit(random_map, target)))
            scores["random/energy"].append(math.nan if target is None else mask_energy(random_map, target))
            random_maps = [torch.from_numpy(np.random.default_rng((seed + index, order)).random(model.layout.grid_hw))
                           for order in range(len(sample.objects))]
            scores["random/class_pointing"].append(float(class_sensitive_hit(random_maps, sample.objects, model.layout.grid_hw))
                                                   if len(sample.objects) > 1 else math.nan)
            index += 1
            if step is not None:
                step()
        batch.clear()

    for item in items:
        batch.append(item)
        if len(batch) == batch_size:
            flush()
    if batch:
        flush()
    return scores


def bootstrap_interval(values: Sequence[float], resamples: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (NaNs dropped): (low, high), NaN when empty. Resampled by
    numpy's generator from ``seed``: the intervals of every published figure."""
    values = np.asarray(values, dtype=np.float64)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return (math.nan, math.nan)
    means = np.random.default_rng(seed).choice(values, size=(resamples, values.size), replace=True).mean(axis=1)
    return (float(np.quantile(means, (1 - level) / 2)), float(np.quantile(means, (1 + level) / 2)))


def score_table(scores: dict[str, list[float]], methods: tuple[str, ...]) -> list[dict]:
    """One row per method (and ``random``): per score its mean and 95% bootstrap interval, None without data."""
    rows = []
    for method in (*methods, "random"):
        row: dict = {"method": method}
        for score in SCORES:
            present = [value for value in scores[f"{method}/{score}"] if not math.isnan(value)]
            row[score] = None if not present else {"mean": fmean(present), "ci95": bootstrap_interval(present),
                                                   "images": len(present)}
        rows.append(row)
    return rows
