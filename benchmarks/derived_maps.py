"""What keeping queries and keys instead of maps costs and saves, on the real DINOv2-S/14 at 518 px (1370 tokens).

    python benchmarks/derived_maps.py [--pairs 7] [--large]

In one process, alternately: the plain fused forward, ``analyze`` as it is (queries and keys from the fused forward,
``map_store.DerivedMaps``), and ``analyze`` as it was (every map kept whole from the explicit path: the same family with
``reads_attention_inputs`` off). Each analysis is followed by what the first screen derives (the overview: the class
token's rows, the rollout) and by the head statistics. Reports medians and ratios to the plain forward, and the bytes of
tensors each ``Analysis`` holds. ``--large`` adds a random model shaped like DINOv2-L/14 at 518 px (24 layers, 16 heads,
dim 1024) in a fresh process each: its peak RSS through one analysis, a clicked patch's every head and the first screen
(the high-water mark reset once the model is built, so that timm's initialisation does not stand in for it), in full and
above what the process held before the model was built (the imported libraries).
Writes benchmarks/derived_maps.json.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from vit_explorer import analyze, load_model  # noqa: E402
from vit_explorer.core import maps  # noqa: E402
from vit_explorer.core.images import model_view, to_pixels  # noqa: E402

OUT = Path(__file__).with_suffix(".json")


def first_screen(analysis) -> None:
    """What an upload shows first (the overview), then the head statistics."""
    maps.overview(analysis)
    for name in ("entropy", "distance", "prefix share"):
        maps.head_statistic(analysis, name)


def timed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def real_dinov2(pairs: int) -> dict:
    from real_weights import TIMM_NAME, real_weights
    from skimage import data

    model = load_model(f"timm:{TIMM_NAME}@{real_weights() / 'timm.safetensors'}", input_hw=(518, 518), device="cpu")
    image = Image.fromarray(data.astronaut())
    pixels = to_pixels(model_view(image, model.preprocess, "stretch"), model.preprocess)
    adapter_type = type(model.adapter)
    results: dict[str, list[float]] = {"plain": [], "derived": [], "derived_first_screen": [], "kept": [],
                                       "kept_first_screen": []}
    sizes = {}
    for repeat in range(pairs + 1):  # the first round warms up and is not counted
        round_times = {"plain": timed(lambda: model.logits(pixels))}
        for kind, reads in (("derived", True), ("kept", False)):
            adapter_type.reads_attention_inputs = reads
            holder = {}
            round_times[kind] = timed(lambda: holder.setdefault("analysis", analyze(model, image)))
            round_times[f"{kind}_first_screen"] = timed(lambda: first_screen(holder["analysis"]))
            sizes[kind] = {"analysis_mib": holder["analysis"].nbytes / 2**20, "maps_mib": holder["analysis"].store.nbytes / 2**20,
                           "storage": holder["analysis"].storage}
        adapter_type.reads_attention_inputs = True
        if repeat:
            for name, value in round_times.items():
                results[name].append(value)
    medians = {name: statistics.median(values) for name, values in results.items()}
    return {"model": f"DINOv2-S/14 (real weights), 518 px, {model.layout.num_tokens} tokens", "pairs": pairs,
            "median_s": medians,
            "ratio_to_plain": {name: medians[name] / medians["plain"] for name in medians if name != "plain"},
            "ratio_to_plain_with_first_screen": {
                kind: (medians[kind] + medians[f"{kind}_first_screen"]) / medians["plain"] for kind in ("derived", "kept")},
            "sizes": sizes}


def status_mib(field: str) -> float:
    """A memory figure of this process from /proc/self/status (``VmRSS`` now, ``VmHWM`` its peak since the last reset)."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def large_child(kind: str) -> None:
    """One analysis of a random DINOv2-L-shaped model at 518 px, a clicked patch's every head and the first screen; prints
    the peak RSS."""
    import timm

    from vit_explorer.models.timm_loading import from_timm_module

    # what the process holds before any model: the Python runtime with torch, timm and this package imported (torch's
    # CUDA wheel alone maps about 690 MiB here, the same for every use of torch), which the model and analysis add to
    before_the_model = status_mib("VmRSS")
    module = timm.create_model("vit_large_patch14_dinov2", pretrained=False, img_size=518).eval()
    model = from_timm_module(module, "timm:vit_large_patch14_dinov2@random")
    if kind == "kept":
        type(model.adapter).reads_attention_inputs = False
    image = Image.fromarray(torch.randint(0, 255, (518, 518, 3), dtype=torch.uint8).numpy())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # building the model with timm's initialisation peaks far above what the loaded model keeps: the memory it freed is
    # handed back and the kernel's high-water mark reset (Linux: clear_refs 5), so that the peak read below is the
    # analysis's, the model's own weights included
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    resident = status_mib("VmRSS")
    started = time.perf_counter()
    analysis = analyze(model, image)
    analysed = time.perf_counter() - started
    patch = analysis.layout.patch_token(18, 18)
    started = time.perf_counter()
    rows = maps.query_rows(analysis, patch) if analysis.store.keeps_rows_of(patch) else None
    clicked = time.perf_counter() - started
    started = time.perf_counter()
    first_screen(analysis)
    screen = time.perf_counter() - started
    started = time.perf_counter()
    model.logits(to_pixels(model_view(image, model.preprocess, "stretch"), model.preprocess))
    plain = time.perf_counter() - started
    print(json.dumps({"storage": analysis.storage, "analysis_mib": analysis.nbytes / 2**20,
                      "every_head_of_a_clicked_patch": rows is not None and tuple(rows.shape) == (24, 16, 1370),
                      "peak_rss_while_building_mib": before / 1024, "rss_of_the_loaded_model_mib": resident,
                      "peak_rss_of_the_analysis_mib": status_mib("VmHWM"), "rss_before_the_model_mib": before_the_model,
                      "peak_rss_above_the_imports_mib": status_mib("VmHWM") - before_the_model,
                      "analyze_s": analysed, "click_s": clicked, "first_screen_s": screen, "plain_forward_s": plain}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--large", action="store_true")
    parser.add_argument("--large-child", choices=("derived", "kept"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.large_child:
        large_child(args.large_child)
        return
    results = {"machine": f"{platform.node()}, {torch.get_num_threads()} threads", "dinov2_s_518": real_dinov2(args.pairs)}
    if args.large:
        results["dinov2_l_shape_518"] = {
            kind: json.loads(subprocess.run([sys.executable, __file__, "--large-child", kind], capture_output=True, text=True,
                                            check=True).stdout.strip().splitlines()[-1]) for kind in ("derived", "kept")}
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
