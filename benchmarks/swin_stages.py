"""What reading a Swin stage by stage costs, on a random-weight Swin-T at 224 px (timm's ``swin_tiny_patch4_window7_224``).

    python benchmarks/swin_stages.py [--pairs 5]

In one process, alternately: the plain forward (timm's fused attention), and ``analyze`` of each stage (one pass that keeps
every block's window maps with the top class's gradients, and the stage's token norms), then the first screen (the
overview: the rollout across stages and the last block's map, placed on the stage's grid when drawn). Reports medians,
their ratios to the plain forward, and the bytes each ``Analysis`` holds. Writes benchmarks/swin_stages.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from PIL import Image

from vit_explorer import analyze, load_model
from vit_explorer.core import maps
from vit_explorer.core.images import model_view, to_pixels
from vit_explorer.models import stage_view

OUT = Path(__file__).with_suffix(".json")
SPEC = "timm:swin_tiny_patch4_window7_224@random"


def timed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=5)
    arguments = parser.parse_args()
    torch.manual_seed(0)
    model = load_model(SPEC, device="cpu")
    from skimage import data

    image = Image.fromarray(data.chelsea()).resize((224, 224))
    pixels = to_pixels(model_view(image, model.preprocess, "stretch"), model.preprocess)
    views = [stage_view(model, stage) for stage in range(model.adapter.num_stages(model.module))]
    forward = []
    per_stage: dict[int, list[float]] = {stage: [] for stage in range(len(views))}
    held: dict[int, dict] = {}
    for _ in range(arguments.pairs):
        with torch.inference_mode():
            forward.append(timed(lambda: model.module(pixels)))
        for stage, view in enumerate(views):
            def upload(view=view, stage=stage) -> None:
                analysis = analyze(view, image)
                maps.overview(analysis)
                held[stage] = {"grid": list(view.layout.grid_hw), "layers x heads": list(view.map_shape),
                               "analysis MiB": round(analysis.nbytes / 2**20, 1),
                               "of which every block's window maps and gradients MiB":
                                   round(analysis.stage_windows.nbytes / 2**20, 1)}
            per_stage[stage].append(timed(upload))
    plain = statistics.median(forward)
    result = {"machine": f"{platform.machine()}, {torch.get_num_threads()} threads", "model": SPEC, "pairs": arguments.pairs,
              "plain forward s (median)": round(plain, 4),
              "stages": {stage: {**held[stage], "upload to first screen s (median)": round(statistics.median(times), 3),
                                 "ratio to the plain forward": round(statistics.median(times) / plain, 1)}
                         for stage, times in per_stage.items()}}
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
