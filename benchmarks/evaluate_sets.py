"""``vit-explorer evaluate`` on the shipped model, over the generator's held-out set and the independent set.

    python benchmarks/evaluate_sets.py [--count 100] [--model builtin:shapes] [--work DIR]

Writes both sets as image folders with masks (the layout ``make-shapes`` writes), runs the CLI on each,
and keeps the tables in ``benchmarks/evaluate_sets.json``. The independent set (``tests/independent_shapes.py``)
is drawn by code that shares nothing with the training generator and was never used to train or tune.
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
from independent_shapes import CLASSES, independent_set  # noqa: E402

from vit_explorer.shapes.train import HELDOUT_SEED  # noqa: E402

METHODS = "rollout,relevance,grad-rollout,cls"


def write_independent(folder: Path, count: int) -> None:
    for index, drawn in enumerate(independent_set(count)):
        for kind, picture in (("images", drawn.image), ("masks", drawn.mask.astype("uint8") * 255)):
            path = folder / kind / CLASSES[drawn.label] / f"{index:06d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(picture).save(path)


def evaluate(folder: Path, model: str, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "vit_explorer", "evaluate", str(folder / "images"), "--model", model,
                    "--methods", METHODS, "--out", str(out)], check=True)
    report = json.loads((out / "evaluation.json").read_text())
    return {key: report[key] for key in ("images", "accuracy", "steps", "random_orders", "baseline", "table")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--model", default="builtin:shapes")
    parser.add_argument("--work", help="where the sets and outputs go (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(args.work or temporary)
        subprocess.run([sys.executable, "-m", "vit_explorer", "make-shapes", str(work / "held-out"), "--count", str(args.count),
                        "--seed", str(HELDOUT_SEED)], check=True)
        write_independent(work / "independent", args.count)
        results = {"model": args.model, "methods": METHODS,
                   "held-out": evaluate(work / "held-out", args.model, work / "held-out-scores"),
                   "independent": evaluate(work / "independent", args.model, work / "independent-scores")}
    (ROOT / "benchmarks" / "evaluate_sets.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
