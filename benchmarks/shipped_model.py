"""Figures of the shipped model for the README: the generator's held-out set beside the independent set.

    python benchmarks/shipped_model.py [--count 500] [--model builtin:shapes]

Writes ``benchmarks/shipped_model.json``. The independent set (``tests/independent_shapes.py``) is drawn
by code that shares nothing with the training generator and was never used to train or tune.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from independent_shapes import independent_set  # noqa: E402

from vit_explorer import analyze, load_model  # noqa: E402
from vit_explorer.methods.evaluation import evaluate_on_shapes  # noqa: E402
from vit_explorer.shapes.generator import generate_set  # noqa: E402
from vit_explorer.shapes.train import HELDOUT_SEED  # noqa: E402


def ood_share(model, images: list[np.ndarray]) -> float:
    return float(np.mean([analyze(model, Image.fromarray(image), explain=False).ood.flagged for image in images]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--model", default="builtin:shapes")
    args = parser.parse_args()
    model = load_model(args.model, device="cpu")
    sets = {"generator held-out": generate_set(HELDOUT_SEED, args.count), "independent": independent_set(args.count)}
    report: dict = {"model": args.model, "count": args.count, "training": None, "sets": {}}
    for name, samples in sets.items():
        figures = evaluate_on_shapes(model, samples).as_dict()
        figures["ood_flagged"] = ood_share(model, [sample.image for sample in samples])
        report["sets"][name] = figures
        print(name, json.dumps(figures), flush=True)
    from skimage import data

    report["photos"] = {}
    for photo in ("astronaut", "chelsea", "coffee", "camera", "rocket"):
        analysis = analyze(model, Image.fromarray(np.asarray(getattr(data, photo)())), explain=False)
        report["photos"][photo] = {"score": analysis.ood.score, "threshold": analysis.ood.threshold,
                                   "flagged": analysis.ood.flagged,
                                   "top": analysis.top_k(1)[0].label, "prob": analysis.top_k(1)[0].prob}
    print(json.dumps(report["photos"]), flush=True)
    out = Path(__file__).with_name("shipped_model.json")
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
