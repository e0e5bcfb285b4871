"""What the Queries and keys tab costs and shows.

    python benchmarks/query_key_view.py [--heads 6]

1. Cost, on a random ViT-B/16 (timm ``vit_base_patch16_224@random``, 197 tokens, 12 heads of dim 64), on this machine:
   one head's projection by PCA and by t-SNE (medians over ``--heads`` heads of the last layer), and the fused forward pass
   that records every layer's queries and keys beside a plain forward (medians of alternated rounds).
2. What it shows, on the shipped model and its example images: for every head, how much of its picture (PCA of the
   moved patch queries and keys) the patches' grid position explains and how much their mean colour explains (R² of a
   linear fit of the 2-D points on (row, column) and on (R, G, B)), and how often a query's most-attended key lies among
   its 5 nearest keys in the picture (``neighbour_agreement``) by PCA and by t-SNE. The heads most explained by position
   and by colour on 03-circle.png are the ones the browser test shows.

Writes benchmarks/query_key_view.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit_explorer import analyze, load_model, run
from vit_explorer.core.analysis import queries_and_keys
from vit_explorer.core.capture import InputsSink, capture
from vit_explorer.core.images import model_view, to_pixels
from vit_explorer.core.query_key_embedding import joint_embedding

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "query_key_view.json"
EXAMPLES = sorted((ROOT / "assets" / "examples").glob("*.png"))


def timed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def cost(heads: int) -> dict:
    model = load_model("timm:vit_base_patch16_224@random")
    image = Image.fromarray((torch.rand(224, 224, 3) * 255).to(torch.uint8).numpy())
    pixels = to_pixels(model_view(image, model.preprocess, "stretch"), model.preprocess)
    analysis = analyze(model, image, explain=False)
    inputs = queries_and_keys(model, analysis)
    layer = model.map_shape[0] - 1
    joint_embedding(inputs.queries[0, 0], inputs.keys[0, 0], "tsne")  # the first call imports scikit-learn's t-SNE
    times = {projection: [timed(lambda h=head, p=projection: joint_embedding(inputs.queries[layer, h], inputs.keys[layer, h], p))
                          for head in range(heads)] for projection in ("pca", "tsne")}
    model.logits(pixels)  # warm-up
    rounds = {"plain": [], "recording": []}
    for _ in range(5):
        rounds["plain"].append(timed(lambda: model.logits(pixels)))
        rounds["recording"].append(timed(lambda: capture(model, pixels, InputsSink(model.map_shape[0]))))
    plain, recording = (statistics.median(rounds[name]) for name in ("plain", "recording"))
    return {"model": "timm:vit_base_patch16_224@random, 197 tokens", "heads_timed": heads,
            "median_projection_s": {name: statistics.median(values) for name, values in times.items()},
            "max_projection_s": {name: max(values) for name, values in times.items()},
            "recording_pass_over_plain_forward": recording / plain}


def fit_share(features: torch.Tensor, points: torch.Tensor) -> float:
    """R² of the least-squares fit of ``points`` [m, 2] on ``features`` [m, f] with an intercept."""
    design = torch.cat([features, torch.ones(len(features), 1, dtype=features.dtype)], dim=1)
    residual = points - design @ torch.linalg.lstsq(design, points).solution
    return float(1 - residual.pow(2).sum() / (points - points.mean(0)).pow(2).sum())


def shown(image_path: Path) -> dict:
    model = load_model()
    analysis = analyze(model, str(image_path))
    layout = analysis.layout
    rows, cols = layout.grid_hw
    patch_h, patch_w = layout.patch_hw
    positions = torch.tensor([[row, col] for row in range(rows) for col in range(cols)], dtype=torch.float64)
    colours = torch.from_numpy(analysis.image[: rows * patch_h, : cols * patch_w].astype(np.float64)
                               .reshape(rows, patch_h, cols, patch_w, 3).mean(axis=(1, 3)).reshape(-1, 3))
    heads = []
    for layer in range(analysis.map_shape[0]):
        for head in range(analysis.map_shape[1]):
            embeddings = {projection: run.query_key_embedding(model, analysis, layer, head, projection)
                          for projection in ("pca", "tsne")}
            pca = embeddings["pca"]
            points = torch.cat([pca.queries[layout.num_prefix_tokens:], pca.keys[layout.num_prefix_tokens:]]).double()
            heads.append({"layer": layer, "head": head,
                          "position_r2": fit_share(torch.cat([positions, positions]), points),
                          "colour_r2": fit_share(torch.cat([colours, colours]), points),
                          "agreement": {name: embedding.agreement for name, embedding in embeddings.items()}})
    by_position = max(heads, key=lambda h: h["position_r2"] - h["colour_r2"])
    by_colour = max(heads, key=lambda h: h["colour_r2"] - h["position_r2"])
    return {"image": image_path.name, "tokens": layout.num_tokens, "chance_agreement": 5 / layout.num_tokens,
            "most_positional": by_position, "most_by_colour": by_colour,
            "median_agreement": {name: statistics.median(h["agreement"][name] for h in heads) for name in ("pca", "tsne")},
            "heads": heads}


def main() -> None:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    results = {"machine": f"{torch.get_num_threads()} threads", "cost": cost(args.heads),
               "shipped_model": [shown(path) for path in EXAMPLES]}
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    summary = {**results, "shipped_model": [{key: value for key, value in image.items() if key != "heads"}
                                            for image in results["shipped_model"]]}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
