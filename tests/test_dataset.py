"""Dataset-scale statistics: listing, streamed totals against a per-image oracle, histogram quantiles,
bad files, resume after SIGTERM, and torchrun's processes against one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, photo, write_checkpoint
from PIL import Image

from vit_explorer import load_model
from vit_explorer.core.capture import StackingSink, capture
from vit_explorer.core.images import load_image, model_view, to_pixels
from vit_explorer.core.statistics import HEAD_STATISTICS, head_statistics
from vit_explorer.errors import VitExplorerError
from vit_explorer.methods.dataset import HISTOGRAM_BINS, HeadTotals, collect, histogram_quantiles, list_images

CLASSES = ["thing 0", "thing 1", "thing 2"]


def image_folder(root: Path, per_class: int = 4) -> Path:
    """``root/CLASS/N.png`` for the tiny model's first three classes, in sizes of their own."""
    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            photo((64 + 8 * index, 48 + 16 * label), seed=label * 10 + index).save(root / name / f"{index}.png")
    return root


@pytest.fixture
def tiny_model(tmp_path):
    return load_model(str(write_checkpoint(tmp_path / "tiny.safetensors", TINY, labels=[*CLASSES, "thing 3", "thing 4"])))


def oracle(model, paths: list[Path]) -> dict[str, np.ndarray]:
    """Each statistic ``[images, layers, heads]`` from each image's full maps, one image at a time."""
    per_image = {name: [] for name in HEAD_STATISTICS}
    for path in paths:
        pixels = to_pixels(model_view(load_image(path), model.preprocess), model.preprocess)
        maps = capture(model, pixels, StackingSink(model.map_shape[0])).kept[0]  # [layers, heads, n, n]
        for name, values in head_statistics(maps, model.layout).items():  # each checked on hand-made maps: test_stats
            per_image[name].append(values.numpy())
    return {name: np.stack(values) for name, values in per_image.items()}


def test_sources_list_images_with_labels_only_for_class_folders(tmp_path):
    folder = image_folder(tmp_path / "set", per_class=2)
    listed = list_images(folder)
    assert listed.classes == CLASSES and listed.labels == [0, 0, 1, 1, 2, 2]
    (tmp_path / "list.txt").write_text("set/thing 1/0.png\n# a comment\n\nset/thing 2/1.png\n")
    assert list_images(tmp_path / "list.txt").paths == [folder / "thing 1" / "0.png", folder / "thing 2" / "1.png"]
    globbed = list_images(str(folder / "*" / "1.png"))
    assert [path.parent.name for path in globbed.paths] == CLASSES and globbed.labels is None
    with pytest.raises(VitExplorerError, match="no images found"):
        list_images(tmp_path / "nothing-*.png")


def test_streamed_totals_equal_the_per_image_oracle(tmp_path, tiny_model):
    images = list_images(image_folder(tmp_path / "set"))
    totals, run = collect(tiny_model, images, tmp_path / "shards", batch_size=3, shard_size=5, show_progress=False)
    expected = oracle(tiny_model, images.paths)
    labels = np.array(images.labels)
    assert float(totals.tensors["count"]) == len(images.paths) and run["shards"] == 3
    for name, values in expected.items():
        np.testing.assert_allclose(totals.tensors[f"sums/{name}"].numpy(), values.sum(0), rtol=1e-5)
        np.testing.assert_allclose(totals.tensors[f"squares/{name}"].numpy(), (values.astype(np.float64) ** 2).sum(0), rtol=1e-5)
        for label in range(len(CLASSES)):
            np.testing.assert_allclose(totals.tensors[f"class_sums/{name}"][label].numpy(), values[labels == label].sum(0),
                                       rtol=1e-5)
        assert totals.tensors[f"histograms/{name}"].sum(-1).eq(len(images.paths)).all()
    predictions = []
    for path in images.paths:
        pixels = to_pixels(model_view(load_image(path), tiny_model.preprocess), tiny_model.preprocess)
        predictions.append(int(tiny_model.logits(pixels).argmax()))
    # the folders are the model's first classes in its own order, so folder index = class index
    assert float(totals.tensors["correct"]) == sum(int(p == label) for p, label in zip(predictions, labels, strict=True))
    assert float(totals.tensors["labelled"]) == len(labels)


def test_histogram_quantiles_are_within_one_bin_of_the_exact_ones():
    values = np.random.default_rng(0).beta(2, 5, size=20_000)
    histogram = np.histogram(values, bins=HISTOGRAM_BINS, range=(0, 1))[0]
    found = histogram_quantiles(torch.from_numpy(histogram), 0.0, 1.0, (0.05, 0.5, 0.95))
    assert found.dtype == torch.float64
    np.testing.assert_allclose(found.numpy(), np.quantile(values, [0.05, 0.5, 0.95]), atol=1 / HISTOGRAM_BINS)


def test_unreadable_files_are_skipped_and_listed_with_their_reason(tmp_path, tiny_model):
    folder = image_folder(tmp_path / "set", per_class=2)
    (folder / "thing 0" / "notes.png").write_text("not an image")
    good = folder / "thing 1" / "0.png"
    (folder / "thing 1" / "cut.png").write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    totals, _ = collect(tiny_model, list_images(folder), tmp_path / "shards", batch_size=4, show_progress=False)
    assert float(totals.tensors["count"]) == 6
    reasons = {Path(entry["path"]).name: entry["reason"] for entry in totals.skipped}
    assert set(reasons) == {"notes.png", "cut.png"}
    assert "not an image" in reasons["notes.png"] and "damaged or truncated" in reasons["cut.png"]


def run_stats(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vit_explorer", "stats", *args], capture_output=True, text=True, timeout=600,
                          **kwargs)


def totals_of(out: Path) -> HeadTotals:
    """The sum of the shard files of a finished run."""
    first, *rest = sorted((out / ".shards").glob("shard-*.pt"))
    totals = HeadTotals.load(first)
    for path in rest:
        totals.merge(HeadTotals.load(path))
    return totals


@pytest.mark.slow
def test_a_run_killed_by_sigterm_resumes_to_the_same_totals(tmp_path):
    folder = image_folder(tmp_path / "set", per_class=12)
    checkpoint = write_checkpoint(tmp_path / "model.safetensors", TINY, labels=[*CLASSES, "thing 3", "thing 4"])
    common = ["--model", str(checkpoint), "--batch-size", "1", "--shard-size", "2", "--workers", "0"]
    whole = run_stats([str(folder), "--out", str(tmp_path / "whole"), *common])
    assert whole.returncode == 0, whole.stderr
    interrupted = tmp_path / "interrupted"
    process = subprocess.Popen([sys.executable, "-m", "vit_explorer", "stats", str(folder), "--out", str(interrupted), *common],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not list((interrupted / ".shards").glob("shard-*.pt")) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    finished_before = len(list((interrupted / ".shards").glob("shard-*.pt")))
    assert 1 <= finished_before < 18, "the run was not stopped mid-way"
    assert not (interrupted / "summary.json").exists()
    resumed = run_stats([str(folder), "--out", str(interrupted), *common, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((interrupted / "summary.json").read_text())
    assert summary["run"]["resumed_shards"] == finished_before and summary["analysed"] == 36
    expected, found = json.loads((tmp_path / "whole" / "summary.json").read_text()), summary
    for name in HEAD_STATISTICS:
        np.testing.assert_allclose(found["statistics"][name]["mean"], expected["statistics"][name]["mean"], rtol=1e-12)
    assert (interrupted / "heads.csv").read_text() == (tmp_path / "whole" / "heads.csv").read_text()
    other = run_stats([str(folder / "thing 0"), "--out", str(interrupted), *common, "--resume"])
    assert other.returncode == 1 and "another run" in other.stderr


@pytest.mark.slow
def test_two_torchrun_processes_give_the_totals_of_one(tmp_path):
    folder = image_folder(tmp_path / "set", per_class=5)
    (folder / "thing 2" / "broken.png").write_text("not an image")
    checkpoint = write_checkpoint(tmp_path / "model.safetensors", TINY, labels=[*CLASSES, "thing 3", "thing 4"])
    common = ["--model", str(checkpoint), "--batch-size", "2", "--shard-size", "3", "--workers", "1"]
    one = run_stats([str(folder), "--out", str(tmp_path / "one"), *common])
    assert one.returncode == 0, one.stderr
    environment = dict(os.environ, OMP_NUM_THREADS="1")
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29533", "-m",
                          "vit_explorer", "stats", str(folder), "--out", str(tmp_path / "two"), *common],
                         capture_output=True, text=True, timeout=600, env=environment)
    assert two.returncode == 0, two.stderr[-3000:]
    expected, found = (json.loads((tmp_path / name / "summary.json").read_text()) for name in ("one", "two"))
    assert found["run"]["processes"] == 2 and found["analysed"] == expected["analysed"] == 15
    assert found["skipped"] == expected["skipped"] and len(found["skipped"]) == 1
    assert found["accuracy"] == expected["accuracy"]
    for name in HEAD_STATISTICS:
        np.testing.assert_allclose(found["statistics"][name]["mean"], expected["statistics"][name]["mean"], rtol=0, atol=1e-6)
    one_totals, two_totals = totals_of(tmp_path / "one"), totals_of(tmp_path / "two")
    for name, tensor in one_totals.tensors.items():
        torch.testing.assert_close(two_totals.tensors[name], tensor, rtol=0, atol=1e-6)


def test_make_shapes_writes_images_with_masks_of_the_same_names(tmp_path):
    from vit_explorer.cli import main

    assert main(["make-shapes", str(tmp_path / "shapes"), "--count", "8", "--seed", "3"]) == 0
    images = sorted((tmp_path / "shapes" / "images").rglob("*.png"))
    masks = sorted((tmp_path / "shapes" / "masks").rglob("*.png"))
    assert len(images) == 8 and [path.relative_to(tmp_path / "shapes" / "images") for path in images] == [
        path.relative_to(tmp_path / "shapes" / "masks") for path in masks]
    for mask in masks:
        covered = np.asarray(Image.open(mask)) > 127
        assert 0 < covered.mean() < 0.5
    assert set(list_images(tmp_path / "shapes" / "images").classes) <= {"circle", "square", "triangle", "star", "cross", "ring"}


@pytest.mark.slow
def test_two_torchrun_processes_evaluate_like_one(tmp_path):
    from vit_explorer.cli import main

    main(["make-shapes", str(tmp_path / "set"), "--count", "5", "--seed", "3"])
    common = ["--model", "builtin:shapes", "--methods", "rollout,relevance", "--steps", "3"]
    one = subprocess.run([sys.executable, "-m", "vit_explorer", "evaluate", str(tmp_path / "set" / "images"), "--out",
                          str(tmp_path / "one"),
                          *common], capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29534", "-m",
                          "vit_explorer", "evaluate", str(tmp_path / "set" / "images"), "--out", str(tmp_path / "two"), *common],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert two.returncode == 0, two.stderr[-3000:]
    expected, found = (json.loads((tmp_path / name / "evaluation.json").read_text()) for name in ("one", "two"))
    assert expected["processes"] == 1 and found["processes"] == 2 and found["images"] == expected["images"] == 5
    assert two.stdout.count("relevance |") == 1  # only the first process prints the table
    for key, values in expected["per_image"].items():
        np.testing.assert_allclose(found["per_image"][key], values, rtol=0, atol=1e-6, err_msg=key)
    assert [row["method"] for row in found["table"]] == ["rollout", "relevance", "random"]
    for found_row, expected_row in zip(found["table"], expected["table"], strict=True):
        for score in ("deletion", "insertion", "perturbation", "pointing", "energy"):
            assert found_row[score]["mean"] == pytest.approx(expected_row[score]["mean"], abs=1e-6)
            assert found_row[score]["ci95"] == pytest.approx(expected_row[score]["ci95"], abs=1e-6)
