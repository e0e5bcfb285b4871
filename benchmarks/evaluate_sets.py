"""``vit-explorer evaluate`` on the shipped model, every map method, over four sets: the generator's held-out set,
the independent set, and two-shape images from each (class-sensitive pointing).

    python benchmarks/evaluate_sets.py [--count 100] [--pairs 200] [--model builtin:shapes] [--work DIR]

Writes each set as an image folder with masks (the layout ``make-shapes`` writes; two-shape images in ``A+B``
folders with one mask per shape), runs the CLI on each, and keeps the tables in ``benchmarks/evaluate_sets.json``.
The independent sets (``tests/independent_shapes.py``) are drawn by code that shares nothing with the training
generator and were never used to train or tune. With ``--work``, a set whose scores are already there is not run
again (a stopped run resumes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from independent_shapes import CLASSES, independent_pairs, independent_set  # noqa: E402

from vit_explorer.core.maps import CLASS_METHODS  # noqa: E402
from vit_explorer.shapes.train import HELDOUT_SEED  # noqa: E402

METHODS = ",".join(CLASS_METHODS)
PAIRS_SEED = 4_242  # neither a training seed nor the held-out one


def write_independent(folder: Path, count: int) -> None:
    for index, drawn in enumerate(independent_set(count)):
        for kind, picture in (("images", drawn.image), ("masks", drawn.mask.astype("uint8") * 255)):
            path = folder / kind / CLASSES[drawn.label] / f"{index:06d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(picture).save(path)


def write_independent_pairs(folder: Path, count: int) -> None:
    for index, pair in enumerate(independent_pairs(count)):
        names = [CLASSES[label] for label in pair.labels]
        path = folder / "images" / "+".join(names) / f"{index:06d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pair.image).save(path)
        for name, mask in zip(names, pair.masks, strict=True):
            mask_path = folder / "masks" / "+".join(names) / f"{index:06d}" / f"{name}.png"
            mask_path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(mask.astype("uint8") * 255).save(mask_path)


def evaluate(folder: Path, model: str, out: Path) -> dict:
    if not (out / "evaluation.json").exists():
        subprocess.run([sys.executable, "-m", "vit_explorer", "evaluate", str(folder / "images"), "--model", model,
                        "--methods", METHODS, "--out", str(out)], check=True)
    report = json.loads((out / "evaluation.json").read_text())
    return {key: report[key] for key in ("images", "accuracy", "steps", "random_orders", "baseline", "table")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100, help="images of each one-shape set")
    parser.add_argument("--pairs", type=int, default=200, help="images of each two-shape set")
    parser.add_argument("--model", default="builtin:shapes")
    parser.add_argument("--work", help="where the sets and outputs go (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(args.work or temporary)
        sets = {
            "held-out": lambda folder: subprocess.run([sys.executable, "-m", "vit_explorer", "make-shapes", str(folder),
                                                       "--count", str(args.count), "--seed", str(HELDOUT_SEED)], check=True),
            "independent": lambda folder: write_independent(folder, args.count),
            "two-shape": lambda folder: subprocess.run([sys.executable, "-m", "vit_explorer", "make-shapes", str(folder),
                                                        "--count", str(args.pairs), "--seed", str(PAIRS_SEED), "--objects",
                                                        "2"], check=True),
            "independent two-shape": lambda folder: write_independent_pairs(folder, args.pairs),
        }
        results = {"model": args.model, "methods": METHODS}
        for name, write in sets.items():
            folder = work / name.replace(" ", "-")
            if not (folder / "images").is_dir():
                write(folder)
            results[name] = evaluate(folder, args.model, work / f"{name.replace(' ', '-')}-scores")
            (ROOT / "benchmarks" / "evaluate_sets.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
