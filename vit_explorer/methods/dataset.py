"""Dataset scale: per-head attention statistics over a folder of images, reduced as each batch arrives,
in one process or many (``torchrun``), resumable after a crash; and a folder's images (with their
classes and masks) for the faithfulness evaluation.

No attention map outlives its layer of its batch: ``capture.InputStatisticsSink`` derives each layer's per-image head
statistics ``[b, heads]`` from its queries and keys in blocks of rows (no n × n map at all; ``capture.StatisticsSink``
reduces the maps of a family that records no queries and keys), and ``HeadTotals`` keeps only sufficient statistics of those:
counts, sums and sums of squares (float64) and fixed-bin histograms, which add up exactly across batches,
shards, processes and machines. Quantiles come from the histograms (``HISTOGRAM_BINS`` equal bins over
each statistic's known range, linear within a bin), so they are exact to one bin's width.

The images are split into shards of ``shard_size`` in listing order; a process takes shards
``rank, rank + world, …`` and writes each finished shard's totals to ``OUT/.shards/``. ``--resume`` loads
those instead of recomputing them, whatever the number of processes, and the final totals are the sum of
every shard's, combined across processes with ``torch.distributed.all_reduce``.
"""

from __future__ import annotations

import csv
import functools
import glob
import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from vit_explorer.core.capture import InputStatisticsSink, StatisticsSink, capture
from vit_explorer.core.images import load_image, model_view, to_pixels
from vit_explorer.core.statistics import HEAD_STATISTICS, STATISTIC_UNITS, DatasetStatistics, head_statistics, patch_distances
from vit_explorer.errors import VitExplorerError
from vit_explorer.methods.evaluation import Labelled
from vit_explorer.models.base import LoadedModel, Preprocess
from vit_explorer.models.layout import TokenLayout

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
HISTOGRAM_BINS = 512
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
SHARD_SIZE = 512


@dataclass(frozen=True)
class ImageList:
    """The images of a source in a fixed order, with their class (index into ``classes``) when the
    source is an ImageFolder-style tree, else None."""

    paths: list[Path]
    labels: list[int] | None = None
    classes: list[str] | None = None

    def sliced(self, start: int, stop: int | None) -> ImageList:
        """The images ``start`` up to ``stop`` (None: to the end), with their labels and the same classes."""
        return ImageList(self.paths[start:stop], None if self.labels is None else self.labels[start:stop], self.classes)


def _images_under(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*") if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES)


def list_images(source: str | Path) -> ImageList:
    """The images of ``source``: a folder (with one sub-folder per class, the ImageFolder convention,
    which gives labels; else every image under it), a text file listing one path per line (relative
    paths are relative to the file), or a glob pattern."""
    path = Path(source).expanduser()
    if path.is_dir():
        class_folders = sorted(child for child in path.iterdir() if child.is_dir() and not child.name.startswith("."))
        loose = [child for child in path.iterdir() if child.is_file() and child.suffix.lower() in IMAGE_SUFFIXES]
        if class_folders and not loose:
            paths, labels = [], []
            for label, folder in enumerate(class_folders):
                found = _images_under(folder)
                paths += found
                labels += [label] * len(found)
            images = ImageList(paths, labels, [folder.name for folder in class_folders])
        else:
            images = ImageList(_images_under(path))
    elif path.is_file():
        lines = [line.strip() for line in path.read_text().splitlines()]
        images = ImageList([(path.parent / line) if not Path(line).is_absolute() else Path(line) for line in lines if line
                            and not line.startswith("#")])
    else:
        images = ImageList(sorted(Path(match) for match in glob.glob(str(source), recursive=True) if Path(match).is_file()))
    if not images.paths:
        raise VitExplorerError(f"{source}: no images found (give a folder, a text file listing image paths, or a glob pattern)")
    return images


class ImageDataset(Dataset):
    """Each item: ``(index, pixels [3, H, W], label or -1, error text or "")``. A file that cannot be
    decoded gives zero pixels and its reason, so that one bad file in a folder does not stop a run."""

    def __init__(self, images: ImageList, preprocess: Preprocess, fit: str = "stretch") -> None:
        self.images = images
        self.preprocess = preprocess
        self.fit = fit

    def __len__(self) -> int:
        return len(self.images.paths)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor, int, str]:
        label = self.images.labels[index] if self.images.labels is not None else -1
        try:
            image = load_image(self.images.paths[index])
            return index, to_pixels(model_view(image, self.preprocess, self.fit), self.preprocess)[0], label, ""
        except VitExplorerError as error:
            return index, torch.zeros(3, *self.preprocess.input_hw), label, str(error)


def labelled_views(images: ImageList, model: LoadedModel, skipped: list[dict[str, str]], *, root: Path | None = None,
                   masks: Path | None = None, fit: str = "stretch") -> Iterator[Labelled]:
    """Each readable image as the model sees it, with its class when the folders name the model's classes
    (else -1) and, when ``masks`` is given, the mask of the same path relative to ``root`` (white on the
    object). Unreadable files are appended to ``skipped`` with their reason."""
    classes = images.classes if images.classes and model.labels and all(name in model.labels for name in images.classes) else None

    def mask_at(path: Path) -> np.ndarray:
        return model_view(load_image(path), model.preprocess, fit).mean(axis=-1) > 127

    for index, path in enumerate(images.paths):
        parts = object_classes(images, index, model)
        try:
            view = model_view(load_image(path), model.preprocess, fit)
            mask, objects = None, ()
            if masks is not None and root is not None:
                relative = path.relative_to(root)
                if parts:  # a folder A+B: one mask per object, masks/A+B/NAME/A.png
                    objects = tuple((model.labels.index(name), mask_at(masks / relative.with_suffix("") / f"{name}.png"))
                                    for name in parts)
                    mask = np.logical_or.reduce([object_mask for _, object_mask in objects])
                else:
                    mask = mask_at(masks / relative)
        except VitExplorerError as error:
            skipped.append({"path": str(path), "reason": str(error)})
            continue
        label = model.labels.index(classes[images.labels[index]]) if classes is not None else -1
        yield Labelled(view, label, mask, objects)


def object_classes(images: ImageList, index: int, model: LoadedModel) -> tuple[str, ...]:
    """The classes of image ``index`` when its folder names several of the model's classes (``A+B``, as
    ``make-shapes --objects 2`` writes), else ()."""
    if images.classes is None or images.labels is None or not model.labels:
        return ()
    parts = tuple(images.classes[images.labels[index]].split("+"))
    return parts if len(parts) > 1 and all(part in model.labels for part in parts) else ()


def statistic_ranges(layout: TokenLayout) -> dict[str, tuple[float, float]]:
    """The range each head statistic can take on ``layout``: the histograms' fixed bins span it."""
    return {"entropy": (0.0, math.log(layout.num_tokens)), "distance": (0.0, float(patch_distances(layout).max()) or 1.0),
            "prefix share": (0.0, 1.0)}


@dataclass
class HeadTotals:
    """Sufficient statistics of per-image head statistics, all float64 tensors that add up exactly:
    ``count`` ``[]``; per statistic ``sums``/``squares`` ``[layers, heads]`` and ``histograms``
    ``[layers, heads, HISTOGRAM_BINS]``; per class ``class_count`` ``[classes]`` and ``class_sums``/
    ``class_squares`` ``[classes, layers, heads]``; ``correct``/``labelled`` for top-1 accuracy. ``skipped``
    lists the files that could not be read, with their reasons."""

    tensors: dict[str, torch.Tensor]
    skipped: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def zeros(cls, layers: int, heads: int, classes: int) -> HeadTotals:
        tensors = {"count": torch.zeros((), dtype=torch.float64), "correct": torch.zeros((), dtype=torch.float64),
                   "labelled": torch.zeros((), dtype=torch.float64), "class_count": torch.zeros(classes, dtype=torch.float64)}
        for name in HEAD_STATISTICS:
            tensors[f"sums/{name}"] = torch.zeros(layers, heads, dtype=torch.float64)
            tensors[f"squares/{name}"] = torch.zeros(layers, heads, dtype=torch.float64)
            tensors[f"histograms/{name}"] = torch.zeros(layers, heads, HISTOGRAM_BINS, dtype=torch.float64)
            tensors[f"class_sums/{name}"] = torch.zeros(classes, layers, heads, dtype=torch.float64)
            tensors[f"class_squares/{name}"] = torch.zeros(classes, layers, heads, dtype=torch.float64)
        return cls(tensors)

    def add(self, values: dict[str, torch.Tensor], ranges: dict[str, tuple[float, float]], labels: torch.Tensor,
            predictions: torch.Tensor | None) -> None:
        """Add a batch: ``values`` ``{name: [b, layers, heads]}``, class-folder ``labels`` ``[b]`` (-1: none),
        and the predictions as class-folder indices ``[b]`` (-1: a class with no folder) when the folders
        name the model's classes."""
        self.tensors["count"] += len(labels)
        labelled = labels >= 0
        if predictions is not None:
            self.tensors["labelled"] += int(labelled.sum())
            self.tensors["correct"] += int((predictions[labelled] == labels[labelled]).sum())
        classes = len(self.tensors["class_count"])
        if classes:
            self.tensors["class_count"] += torch.bincount(labels[labelled], minlength=classes).double()
        for name, batch in values.items():
            batch = batch.double()  # [b, layers, heads]
            self.tensors[f"sums/{name}"] += batch.sum(0)
            self.tensors[f"squares/{name}"] += (batch**2).sum(0)
            low, high = ranges[name]
            # [b, layers, heads]
            bins = ((batch - low) / (high - low) * HISTOGRAM_BINS).floor().clamp(0, HISTOGRAM_BINS - 1).long()
            self.tensors[f"histograms/{name}"] += torch.nn.functional.one_hot(bins, HISTOGRAM_BINS).sum(0).double()
            if classes and labelled.any():
                index = labels[labelled]
                self.tensors[f"class_sums/{name}"].index_add_(0, index, batch[labelled])
                self.tensors[f"class_squares/{name}"].index_add_(0, index, batch[labelled] ** 2)

    def merge(self, other: HeadTotals) -> None:
        for name, tensor in other.tensors.items():
            self.tensors[name] += tensor
        self.skipped += other.skipped

    def save(self, path: Path) -> None:
        partial = path.with_suffix(".partial")
        torch.save({"tensors": self.tensors, "skipped": self.skipped}, partial)
        partial.replace(path)

    @classmethod
    def load(cls, path: Path) -> HeadTotals:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        return cls(saved["tensors"], saved["skipped"])


def histogram_quantiles(histogram: torch.Tensor, low: float, high: float,
                        quantiles: tuple[float, ...] = QUANTILES) -> torch.Tensor:
    """Quantiles ``[..., len(quantiles)]`` float64 of values counted in ``histogram`` ``[..., bins]`` of equal bins
    over [low, high], interpolated linearly within the bin where each falls."""
    counts = histogram.double()
    cumulative = counts.cumsum(dim=-1)  # [..., bins]
    total = cumulative[..., -1:]
    width = (high - low) / counts.shape[-1]
    result = []
    for quantile in quantiles:
        wanted = quantile * total  # [..., 1]
        bin_index = (cumulative < wanted).sum(dim=-1, keepdim=True).clamp_max(counts.shape[-1] - 1)
        before = torch.where(bin_index > 0, cumulative.gather(-1, (bin_index - 1).clamp_min(0)), 0.0)
        inside = counts.gather(-1, bin_index)
        fraction = torch.where(inside > 0, (wanted - before) / torch.where(inside > 0, inside, 1.0), 0.0)
        result.append((low + (bin_index + fraction) * width)[..., 0])
    return torch.stack(result, dim=-1)


def _shard_batches(count: int, shards: list[int], shard_size: int, batch_size: int) -> Iterator[list[int]]:
    for shard in shards:
        stop = min(count, (shard + 1) * shard_size)
        for start in range(shard * shard_size, stop, batch_size):
            yield list(range(start, min(start + batch_size, stop)))


def process_rank() -> tuple[int, int]:
    """This process's rank and the number of processes (0, 1 outside torchrun)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


@contextmanager
def process_group(device: str | None) -> Iterator[tuple[str | None, int, int]]:
    """Join ``torchrun``'s process group when there is one (``WORLD_SIZE`` > 1): NCCL with this process's
    GPU when CUDA is there and ``device`` does not say otherwise, else gloo. Yields (device, rank, world)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        yield device, 0, 1
        return
    on_gpu = torch.cuda.is_available() and (device is None or device.startswith("cuda"))
    if on_gpu:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        torch.cuda.set_device(device)
    torch.distributed.init_process_group("nccl" if on_gpu else "gloo")
    try:
        yield device, torch.distributed.get_rank(), torch.distributed.get_world_size()
    finally:
        torch.distributed.destroy_process_group()


def gather_in_rank_order(part: list) -> list:
    """Every process's ``part`` (picklable) concatenated in rank order; ``part`` itself in one process."""
    rank, world = process_rank()
    if world == 1:
        return part
    gathered: list = [None] * world
    torch.distributed.all_gather_object(gathered, part)
    return [entry for each in gathered for entry in each]


def contiguous_share(count: int) -> range:
    """This process's block of ``range(count)``: blocks in rank order, so concatenating the processes'
    results in rank order gives one process's order."""
    rank, world = process_rank()
    size = math.ceil(count / world)
    return range(min(count, rank * size), min(count, (rank + 1) * size))


def check_manifest(path: Path, manifest: dict, resume: bool, rank: int) -> None:
    """Refuse to resume from the shards beside ``path`` where another run made them (its manifest there differs from
    ``manifest``); the first process notes this run's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if resume and path.is_file() and json.loads(path.read_text()) != manifest:
        raise VitExplorerError(f"the shards in {path.parent} were made by another run ({path.read_text()}); drop --resume to "
                               "start over, or choose another --out")
    if rank == 0:
        path.write_text(json.dumps(manifest))


def collect(model: LoadedModel, images: ImageList, shard_folder: Path, *, batch_size: int = 32, workers: int = 0,
            fit: str = "stretch", shard_size: int = SHARD_SIZE, resume: bool = False,
            show_progress: bool = True) -> tuple[HeadTotals, dict]:
    """Run ``model`` over ``images`` and return the totals of every process (the same on each) and what
    the run did (``{"shards", "resumed_shards", "seconds", "images_per_s"}``).

    Shard files go to ``shard_folder``; with ``resume``, a shard whose file exists is loaded, not recomputed.
    Under ``torch.distributed``, this process runs its share of the shards and the totals are summed
    across processes (a ``DistributedSampler`` is not used: it pads a shard with repeated images, which
    would count them twice, and its order does not follow resumable shards)."""
    from tqdm import tqdm

    rank, world = process_rank()
    layers, heads = model.map_shape
    classes = len(images.classes or [])
    ranges = statistic_ranges(model.layout)
    # accuracy needs the folders to name the model's classes: each model class's folder index (-1: none)
    folder_of_class = None
    if images.classes and model.labels and all(name in model.labels for name in images.classes):
        folder_of_class = torch.tensor([images.classes.index(name) if name in images.classes else -1 for name in model.labels])
    count = len(images.paths)
    check_manifest(shard_folder / "manifest.json", {"model": model.name, "images": count, "shard_size": shard_size,
                                                    "first": str(images.paths[0]), "last": str(images.paths[-1])},
                   resume, rank)
    mine = list(range(rank, math.ceil(count / shard_size), world))
    totals = HeadTotals.zeros(layers, heads, classes)
    todo = []
    for shard in mine:
        path = shard_folder / f"shard-{shard:06d}.pt"
        if resume and path.is_file():
            totals.merge(HeadTotals.load(path))
        else:
            todo.append(shard)
    resumed = len(mine) - len(todo)
    todo_images = sum(min(count, (shard + 1) * shard_size) - shard * shard_size for shard in todo)
    loader = DataLoader(ImageDataset(images, model.preprocess, fit),
                        batch_sampler=list(_shard_batches(count, todo, shard_size, batch_size)),
                        num_workers=workers)
    started = time.perf_counter()
    bar = tqdm(total=todo_images, unit="img", disable=not show_progress or rank != 0, dynamic_ncols=True)
    shard_totals, shard_done = None, 0
    for indices, pixels, labels, errors in loader:
        shard = int(indices[0]) // shard_size
        if shard_totals is None:
            shard_totals = HeadTotals.zeros(layers, heads, classes)
        good = torch.tensor([error == "" for error in errors])
        shard_totals.skipped += [{"path": str(images.paths[int(index)]), "reason": error} for index,
                                 error in zip(indices, errors, strict=True) if error]
        if good.any():
            # the statistics from the fused forward's queries and keys where the family records them: no n × n map
            sink = (InputStatisticsSink(model.layout) if model.adapter.reads_attention_inputs
                    else StatisticsSink(model.layout, head_statistics))
            captured = capture(model, pixels[good].to(model.device), sink)
            predictions = None if folder_of_class is None else folder_of_class[captured.logits.argmax(-1).cpu()]
            shard_totals.add(captured.kept, ranges, labels[good], predictions)
        bar.update(len(indices))
        shard_done += len(indices)
        if shard_done == min(count, (shard + 1) * shard_size) - shard * shard_size:
            shard_totals.save(shard_folder / f"shard-{shard:06d}.pt")
            totals.merge(shard_totals)
            shard_totals, shard_done = None, 0
    bar.close()
    seconds = time.perf_counter() - started
    if world > 1:
        for tensor in totals.tensors.values():
            torch.distributed.all_reduce(tensor)
        totals.skipped = sorted(gather_in_rank_order(totals.skipped), key=lambda entry: entry["path"])
    run = {"shards": math.ceil(count / shard_size), "resumed_shards": resumed, "processes": world, "seconds": seconds,
           "images_per_s": todo_images / seconds if seconds > 0 else None,
           "accuracy_reason": None if folder_of_class is not None else
           ("the source has no class folders" if not images.classes
            else "the class folders do not all name classes of the model")}
    return totals, run


def mean_and_std(sums: torch.Tensor, squares: torch.Tensor, count: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and (population) standard deviation ``[layers, heads]`` from sums and sums of squares over ``count`` images."""
    mean = sums / max(count, 1.0)
    return mean, (squares / max(count, 1.0) - mean**2).clamp_min(0.0).sqrt()


def cells(mean: torch.Tensor, std: torch.Tensor) -> Iterator[tuple[tuple[int, int], float, float]]:
    """((layer, head), mean, std) for every head, as Python numbers for a table row."""
    for layer, (means, stds) in enumerate(zip(mean.tolist(), std.tolist(), strict=True)):
        for head, (value, spread) in enumerate(zip(means, stds, strict=True)):
            yield (layer, head), value, spread


def head_table(totals: HeadTotals, ranges: dict[str, tuple[float, float]], classes: list[str] | None) -> list[dict]:
    """One row per (group, statistic, layer, head): group ``all`` with count, mean, std and quantiles,
    then one group per class with count, mean and std."""
    rows = []
    count = float(totals.tensors["count"])
    for name in HEAD_STATISTICS:
        mean, std = mean_and_std(totals.tensors[f"sums/{name}"], totals.tensors[f"squares/{name}"], count)  # [layers, heads]
        # [layers][heads][quantiles]
        quantiles = histogram_quantiles(totals.tensors[f"histograms/{name}"], *ranges[name]).tolist()
        for (layer, head), value, spread in cells(mean, std):
            row = {"group": "all", "statistic": name, "layer": layer, "head": head, "count": int(count), "mean": value,
                   "std": spread}
            row.update({f"q{round(q * 100):02d}": quantiles[layer][head][i] for i, q in enumerate(QUANTILES)})
            rows.append(row)
        for index, class_name in enumerate(classes or []):
            class_count = float(totals.tensors["class_count"][index])
            class_mean, class_std = mean_and_std(totals.tensors[f"class_sums/{name}"][index],
                                                 totals.tensors[f"class_squares/{name}"][index],
                                                 class_count)
            for (layer, head), value, spread in cells(class_mean, class_std):
                rows.append({"group": class_name, "statistic": name, "layer": layer, "head": head, "count": int(class_count),
                             "mean": value, "std": spread})
    return rows


def dataset_tables(totals: HeadTotals, run: dict, model: LoadedModel, source: str, images: ImageList) -> tuple[list[dict], dict]:
    """What a ``stats`` run writes, as data: the rows of ``heads.csv`` (``head_table``) and ``summary.json``."""
    ranges = statistic_ranges(model.layout)
    rows = head_table(totals, ranges, images.classes)
    count = float(totals.tensors["count"])
    means = {name: (totals.tensors[f"sums/{name}"] / max(count, 1.0)).tolist() for name in HEAD_STATISTICS}
    labelled = float(totals.tensors["labelled"])
    summary = {
        "model": model.name, "source": source, "images": len(images.paths), "analysed": int(count), "skipped": totals.skipped,
        "accuracy": float(totals.tensors["correct"]) / labelled if labelled else None, "accuracy_reason": run["accuracy_reason"],
        "classes": images.classes, "layers_heads": list(model.map_shape),
        "statistics": {name: {"unit": STATISTIC_UNITS[name], "range": list(ranges[name]), "mean": means[name]}
                       for name in HEAD_STATISTICS},
        "quantiles": f"from {HISTOGRAM_BINS}-bin histograms over each statistic's range, linear within a bin",
        "run": run,
    }
    return rows, summary


def read_statistics_cached(folder: str | Path) -> DatasetStatistics:
    """``read_statistics``, read again only when the folder's ``summary.json`` changed (a new run)."""
    summary = Path(folder).expanduser() / "summary.json"
    try:
        changed = summary.stat().st_mtime_ns
    except OSError:
        changed = None
    return _read_once(str(folder), changed)


@functools.lru_cache(maxsize=4)
def _read_once(folder: str, changed: int | None) -> DatasetStatistics:
    return read_statistics(folder)


def read_statistics(folder: str | Path) -> DatasetStatistics:
    """Read a ``vit-explorer stats`` output folder (``summary.json`` and ``heads.csv``)."""
    folder = Path(folder).expanduser()
    try:
        summary = json.loads((folder / "summary.json").read_text())
        layers, heads = summary["layers_heads"]
        with open(folder / "heads.csv", newline="") as handle:
            rows = [row for row in csv.DictReader(handle) if row["group"] == "all"]
        mean, low, high = ({name: torch.full((layers, heads), math.nan, dtype=torch.float64) for name in HEAD_STATISTICS}
                           for _ in range(3))
        for row in rows:
            if row["statistic"] in HEAD_STATISTICS:
                where = (row["statistic"], int(row["layer"]), int(row["head"]))
                for target, column in ((mean, "mean"), (low, "q05"), (high, "q95")):
                    target[where[0]][where[1:]] = float(row[column])
    except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
        raise VitExplorerError(f"{folder} is not a folder written by `vit-explorer stats` (it needs summary.json and heads.csv): "
                               f"{type(error).__name__}") from None
    if any(values.isnan().any() for values in mean.values()):
        raise VitExplorerError(f"{folder}/heads.csv lacks some heads of the {layers}×{heads} the summary names; run "
                               "`vit-explorer stats` again")
    return DatasetStatistics(str(folder), str(summary.get("model", "?")), str(summary.get("source", "?")),
                             int(summary.get("analysed", 0)),
                             mean, low, high)
