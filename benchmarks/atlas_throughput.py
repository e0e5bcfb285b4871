"""How fast ``vit-explorer atlas`` streams a folder, against the plain batched forward of the same model.

    python benchmarks/atlas_throughput.py [--images 48] [--batch-size 16] [--repeats 3]

For each model: the median over ``--repeats`` of the atlas's collection (statistics and each head's share of the
answer, or its output vectors for a model that reads text; no TextSpan), and of the plain forward pass over the same
batches, timed alternately in one process; the ratio is images per second of the atlas over the plain forward's. Then
TextSpan's cost over the bank, for the shapes-CLIP. Writes benchmarks/atlas_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from vit_explorer import load_model
from vit_explorer.cli import main
from vit_explorer.methods import atlas
from vit_explorer.methods.dataset import ImageDataset, list_images
from vit_explorer.methods.text_bank import default_bank

MODELS = ("builtin:shapes", "builtin:shapes-clip", "timm:vit_base_patch16_224@random")


def plain(model, batches: list[torch.Tensor]) -> None:
    with torch.inference_mode():
        for pixels in batches:
            model.adapter.logits(model.module, pixels)


def main_run(images: int, batch_size: int, repeats: int) -> dict:
    folder = Path(tempfile.mkdtemp())
    assert main(["make-shapes", str(folder / "set"), "--count", str(images), "--seed", "5"]) in (0, None)
    listed = list_images(folder / "set" / "images")
    results = {"machine": f"{platform.node()}, {torch.get_num_threads()} threads", "images": images, "batch_size": batch_size,
               "models": {}}
    for spec in MODELS:
        model = load_model(spec, device="cpu")
        dataset = ImageDataset(listed, model.preprocess)
        batches = [torch.stack([dataset[index][1] for index in range(start, min(start + batch_size, images))])
                   for start in range(0, images, batch_size)]
        atlas.collect(model, listed, batch_size=batch_size)  # warm-up
        atlas_s, plain_s = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            atlas.collect(model, listed, batch_size=batch_size)
            atlas_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            plain(model, batches)
            plain_s.append(time.perf_counter() - started)
        row = {"atlas_s": statistics.median(atlas_s), "plain_forward_s": statistics.median(plain_s)}
        row["throughput_ratio"] = row["plain_forward_s"] / row["atlas_s"]
        if model.text is not None:
            found = atlas.collect(model, listed, batch_size=batch_size)
            bank = default_bank(model.labels)
            started = time.perf_counter()
            atlas.describe(found, bank, model.text.embed(bank))
            row["textspan_s"] = time.perf_counter() - started
            row["bank"] = len(bank)
        results["models"][spec] = row
        print(spec, {key: round(value, 3) if isinstance(value, float) else value for key, value in row.items()}, flush=True)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    found = main_run(args.images, args.batch_size, args.repeats)
    (Path(__file__).parent / "atlas_throughput.json").write_text(json.dumps(found, indent=2) + "\n")
