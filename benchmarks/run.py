"""vit_explorer benchmark: is the app interactive? Prints a table and writes benchmarks/results.json.

Every figure is a median over repetitions after warm-up, and the ones that matter are ratios of two
timings taken in the same run (this machine is shared and noisy). No network is used.

    python benchmarks/run.py            # the full run (a few minutes on 2 cores)
    python benchmarks/run.py --tiny     # a small smoke run (CI), same code paths
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vit_explorer.core import decomposition, relevance
from vit_explorer.core.analysis import analyze, class_evidence, pixels_of
from vit_explorer.core.attnlrp import attnlrp
from vit_explorer.core.capture import TOP, AttentionRecorder, StackingSink, capture, record_attention
from vit_explorer.core.curves import ROAD
from vit_explorer.core.legrad import legrad
from vit_explorer.core.maps import CLASS_METHODS, RolloutOptions, class_map
from vit_explorer.core.rollout import attention_rollout, rollout_factors, rollout_rows
from vit_explorer.draw import pictures, render
from vit_explorer.methods.ablation import head_ablation
from vit_explorer.methods.faithfulness import deletion_insertion, forward_passes
from vit_explorer.methods.scoreboard import scoreboard
from vit_explorer.models import load_model
from vit_explorer.models.base import LoadedModel, Preprocess
from vit_explorer.models.vit import ViT
from vit_explorer.models.vit_pytorch import VitPytorchAdapter
from vit_explorer.web.session import Controls, ModelCache
from vit_explorer.web.tabs import TABS, layers_heads, shared
from vit_explorer.web.tabs import class_maps as class_tab

ROOT = Path(__file__).resolve().parent.parent

VIT_B16 = {"image_size": 224, "patch_size": 16, "num_classes": 1000, "dim": 768, "depth": 12, "heads": 12, "dim_head": 64,
           "mlp_dim": 3072}
VIT_L_518 = {"image_size": 518, "patch_size": 14, "num_classes": 10, "dim": 64, "depth": 24, "heads": 16, "dim_head": 8,
             "mlp_dim": 128}
TINY = {"image_size": 64, "patch_size": 16, "num_classes": 10, "dim": 32, "depth": 2, "heads": 2, "dim_head": 16, "mlp_dim": 64}


def median_time(function, repeats: int, warmup: int = 1) -> float:
    """Median seconds of ``function()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def random_model(config: dict, name: str) -> LoadedModel:
    torch.manual_seed(0)
    module = ViT(**config).eval()
    adapter = VitPytorchAdapter()
    size = (config["image_size"], config["image_size"])
    return LoadedModel(module=module, name=name, preprocess=Preprocess(input_hw=size), layout=adapter.layout(module, size),
                       adapter=adapter)


def photo(size: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    from PIL import Image

    noise = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    return np.asarray(noise.resize((size, size), Image.Resampling.BICUBIC))


def paired_ratio(numerator, denominator, repeats: int, warmup: int = 1) -> dict:
    """Median of per-pair ratios, the two functions run alternately, so that the machine's drift
    (other jobs on its shared cores) hits both sides of each pair alike; plus each side's median."""
    for _ in range(warmup):
        denominator()
        numerator()
    ratios, tops, bottoms = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        denominator()
        middle = time.perf_counter()
        numerator()
        end = time.perf_counter()
        bottoms.append(middle - start)
        tops.append(end - middle)
        ratios.append((end - middle) / (middle - start))
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"numerator_s": statistics.median(tops), "denominator_s": statistics.median(bottoms),
            "ratio": statistics.median(ratios),
            "ratio_q1": quartiles[0], "ratio_q3": quartiles[2], "pair_ratios": ratios}


def capture_overhead(models: dict[str, LoadedModel], batches: list[int], repeats: int) -> list[dict]:
    """Forward with capture / the same forward without it, alternated pair by pair: ``record_attention``
    (a fresh output tensor each call) and an ``AttentionRecorder`` reusing its output tensor."""
    rows = []
    for name, model in models.items():
        for batch in batches:
            images = torch.randn(batch, 3, *model.preprocess.input_hw)

            def plain():
                with torch.inference_mode():
                    model.module(images)

            fresh = paired_ratio(lambda: record_attention(model, images), plain, repeats)
            with AttentionRecorder(model, reuse_output=True) as record:
                reused = paired_ratio(lambda: record(images), plain, repeats)
            rows.append({"model": name, "batch": batch, "forward_s": fresh["denominator_s"], "capture_s": fresh["numerator_s"],
                         "ratio": fresh["ratio"], "ratio_q1": fresh["ratio_q1"], "ratio_q3": fresh["ratio_q3"],
                         "pair_ratios": fresh["pair_ratios"],
                         "ratio_reused_output": reused["ratio"]})
    return rows


def class_maps(models: dict[str, LoadedModel], repeats: int) -> list[dict]:
    """What the class-maps tab costs, as ratios to one forward pass of the same model: a new target
    class (forward + backward with the maps kept), a method change (cached), a faithfulness score."""
    rows = []
    for name, model in models.items():
        cache = ModelCache()
        cache.put(name, model)
        with tempfile.TemporaryDirectory() as folder:
            from PIL import Image

            path = Path(folder) / "image.png"
            Image.fromarray(photo(model.preprocess.input_hw[0])).save(path)
            session = shared.run_analysis(cache, str(path), name, "Class maps", *values_of())[0]
        pixels = torch.randn(1, 3, *model.preprocess.input_hw)

        def forward():
            with torch.inference_mode():
                model.module(pixels)

        targets = iter(range(10**6))

        def new_target():  # a class not seen before, so nothing is reused
            session.analysis.evidence.clear()
            shared.on_target(cache, session, next(targets) % session.analysis.num_classes, "Class maps", *values_of())

        methods = alternating(values_of(method="grad-rollout"), values_of())  # each call a change: the open tab redraws

        events = {
            "target class (forward + backward)": (new_target, repeats),
            "map method (cached)": (lambda: shared.on_controls(session, "Class maps", *next(methods)), repeats),
            f"faithfulness score ({forward_passes()} images)": (lambda: class_tab.on_score(cache, session, "blur", *values_of()),
                                                               max(1, repeats // 3)),
        }
        for event, (function, count) in events.items():
            timing = paired_ratio(function, forward, count)
            rows.append({"model": name, "event": event, "update_s": timing["numerator_s"], "ratio_to_forward": timing["ratio"]})
    return rows


def method_costs(models: dict[str, LoadedModel], repeats: int) -> list[dict]:
    """The passes of their own that LeGrad and AttnLRP take for one image and class, as a multiple of one forward and
    backward pass of the same model (``capture`` with the class's gradients: what an upload or a new target costs),
    the two alternated pair by pair."""
    rows = []
    for name, model in models.items():
        pixels = torch.randn(1, 3, *model.preprocess.input_hw)
        target = int(model.logits(pixels).argmax())
        for method, function in (("LeGrad", lambda: legrad(model, pixels, target)),
                                 ("AttnLRP", lambda: attnlrp(model, pixels, target))):
            timing = paired_ratio(function, lambda: capture(model, pixels, target=target), repeats)
            rows.append({"model": name, "method": method, "method_s": timing["numerator_s"],
                         "forward_backward_s": timing["denominator_s"],
                         "ratio": timing["ratio"], "ratio_q1": timing["ratio_q1"], "ratio_q3": timing["ratio_q3"],
                         "pair_ratios": timing["pair_ratios"]})
    return rows


def decomposition_cost(models: dict[str, LoadedModel], repeats: int) -> list[dict]:
    """The upload's one pass (maps kept, norms, the top class's gradients) with the decomposition read off its graph,
    against the same pass without it, alternated pair by pair; and the app's whole upload (``run_analysis``, which
    decomposes), so that the time the decomposition adds is seen against what a user waits for. The attention biases'
    pass (once per model) is paid in the warm-up, as it is by a model's first upload."""
    rows = []
    for name, model in models.items():
        pixels = torch.randn(1, 3, *model.preprocess.input_hw)
        layers = model.map_shape[0]

        def upload_pass(reader=None):
            capture(model, pixels, StackingSink(layers), target=TOP, reduce_gradients=relevance.layer_evidence, norms=True,
                    graph_reader=reader)

        timing = paired_ratio(lambda: upload_pass(decomposition.reading), upload_pass, repeats)
        cache = ModelCache()
        cache.put(name, model)
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "image.png"
            Image.fromarray(photo(model.preprocess.input_hw[0])).save(path)
            upload_s = median_time(lambda: shared.run_analysis(cache, str(path), name, "Overview", *values_of()), repeats)
        added_s = timing["numerator_s"] - timing["denominator_s"]
        rows.append({"model": name, "pass_with_decomposition_s": timing["numerator_s"], "pass_without_s": timing["denominator_s"],
                     "pass_ratio": timing["ratio"], "pass_ratio_q1": timing["ratio_q1"], "pass_ratio_q3": timing["ratio_q3"],
                     "app_upload_s": upload_s, "upload_ratio": upload_s / (upload_s - added_s),
                     "pair_ratios": timing["pair_ratios"]})
    return rows


def scoreboard_time(model: LoadedModel, repeats: int) -> list[dict]:
    """The scoreboard of every method on one image (blur), median seconds; and one ROAD faithfulness score against one
    blur score of the same map, alternated pair by pair (ROAD's imputation is the cost)."""
    analysis = analyze(model, Image.fromarray(photo(model.preprocess.input_hw[0])))
    seconds = median_time(lambda: scoreboard(model, analysis), repeats)
    evidence = class_evidence(model, analysis)
    grid_map = class_map(analysis, "relevance", evidence, RolloutOptions())
    road = paired_ratio(lambda: deletion_insertion(model, analysis.image, grid_map, evidence.target, protocol=ROAD),
                        lambda: deletion_insertion(model, analysis.image, grid_map, evidence.target), max(1, repeats // 3))
    return [{"model": model.name, "methods": len(CLASS_METHODS), "scoreboard_s": seconds, "road_score_s": road["numerator_s"],
             "blur_score_s": road["denominator_s"], "road_over_blur": road["ratio"]}]


def interaction_latency(models: dict[str, LoadedModel], repeats: int) -> list[dict]:
    """Server-side time of the app's update callbacks on cached maps, and as a ratio to one forward pass."""
    rows = []
    controls = Controls()
    values = values_of()
    for name, model in models.items():
        cache = ModelCache()
        cache.put(name, model)
        size = model.preprocess.input_hw[0]
        image = photo(size)
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "image.png"
            from PIL import Image

            Image.fromarray(image).save(path)
            session = shared.run_analysis(cache, str(path), name, "Layers × heads", *values)[0]
            pixels = torch.randn(1, 3, *model.preprocess.input_hw)

            def forward():
                with torch.inference_mode():
                    model.module(pixels)

            forward_s = median_time(forward, repeats)
            layers_heads.render_grid(session, controls)
            tiles = alternating(*(select(x + 2, y + 2) for y, x in (layers_heads.view(session).geometry.tile_origin(0, 0),
                                                                      layers_heads.view(session).geometry.tile_origin(1, 1))))
            height, width = pictures.view_hw(session.analysis)
            clicks = iter(range(10**6))

            def next_patch():  # a different patch each time, so no memoised rows are reused
                step = next(clicks)
                return shared.on_patch_click(cache, select((step * 37) % width, (step * 53) % height), session, "Layers × heads",
                                             *values)

            # each call changes the control, so that the open tab draws (an unchanged control draws nothing)
            colormaps = alternating(values_of(cmap="viridis"), values)
            orderings = alternating(values_of(normalisation="shared", order_by="entropy"), values)
            rollouts = alternating(values_of(head_fusion="max", discard_ratio=0.3), values)

            def open_tab(tab):
                def draw():  # as if opened for the first time on this analysis: nothing drawn, nothing derived
                    session.screen.shown.clear()
                    session.analysis.derived.clear()
                    return shared.opener(tab)(session, *values)

                return draw

            events = {
                "layer/head (tile click)": lambda: layers_heads.on_tile_click(next(tiles), session, *values),
                "query patch (image click)": next_patch,
                "colormap": lambda: shared.on_controls(session, "Layers × heads", *next(colormaps)),
                "normalisation/ordering": lambda: shared.on_controls(session, "Layers × heads", *next(orderings)),
                "rollout options": lambda: shared.on_controls(session, "Rollout", *next(rollouts)),
                "upload (run_analysis: forward + backward, shared views, open tab)":
                    lambda: shared.run_analysis(cache, str(path), name, "Overview", *values),
                **{f"open tab: {tab.title}": open_tab(tab) for tab in TABS},
            }
            for event, function in events.items():
                seconds = median_time(function, repeats)
                rows.append({"model": name, "event": event, "update_s": seconds, "ratio_to_forward": seconds / forward_s})
    return rows


def values_of(**changes) -> tuple:
    """Control values as the app passes them (``CONTROL_NAMES`` order)."""
    return Controls.named(**changes).values()


def alternating(*values):
    """An endless iterator over ``values`` in turn."""
    import itertools

    return itertools.cycle(values)


def select(x: float, y: float):
    import gradio as gr

    return gr.SelectData(None, {"index": [int(x), int(y)], "value": None, "selected": True})


def rendering(layers: int, heads: int, repeats: int) -> dict:
    """The layers × heads grid with numpy LUTs / the same grid with one matplotlib subplot per tile."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rng = np.random.default_rng(0)
    maps = rng.random((layers, heads, 14, 14)).astype(np.float32)
    image = photo(224)

    def ours():
        tiles = render.heat(maps, (60, 60), "inferno", image=image)
        render.tile_grid(tiles, [f"L{i}" for i in range(layers)], [f"h{i}" for i in range(heads)])

    def matplotlib_grid():
        figure = Figure(figsize=(heads, layers), dpi=60)
        axes = figure.subplots(layers, heads, squeeze=False)
        for layer in range(layers):
            for head in range(heads):
                axes[layer, head].imshow(image)
                axes[layer, head].imshow(maps[layer, head], cmap="inferno", alpha=0.6, extent=(0, 224, 224, 0),
                                         interpolation="bilinear")
                axes[layer, head].set_axis_off()
        canvas = FigureCanvasAgg(figure)
        canvas.draw()
        np.asarray(canvas.buffer_rgba())

    ours_s = median_time(ours, repeats)
    matplotlib_s = median_time(matplotlib_grid, max(1, repeats // 3))
    return {"grid": f"{layers}x{heads}", "numpy_s": ours_s, "matplotlib_s": matplotlib_s, "ratio": ours_s / matplotlib_s}


def rollout_scaling(token_counts: list[int], layers: int, repeats: int) -> list[dict]:
    """One query row in O(layers·n²) / the full n×n rollout product."""
    rows = []
    for n in token_counts:
        generator = torch.Generator().manual_seed(n)
        attentions = torch.softmax(torch.randn(layers, 1, n, n, generator=generator), dim=-1)
        factors = rollout_factors(attentions)
        one_hot = torch.zeros(1, n)
        one_hot[0, 0] = 1.0
        row_s = median_time(lambda: rollout_rows(factors, one_hot), repeats)
        full_s = median_time(lambda: attention_rollout(attentions), max(1, repeats // 2))
        factors_s = median_time(lambda: rollout_factors(attentions), max(1, repeats // 2))
        rows.append({"tokens": n, "row_s": row_s, "full_s": full_s, "factors_s": factors_s,
                     "ratio": row_s / full_s, "ratio_with_factors": (row_s + factors_s) / full_s})
    return rows


def memory(models: dict[str, LoadedModel]) -> list[dict]:
    """Bytes one analysis holds in the session state (with the default 1 GiB budget)."""
    rows = []
    for name, model in models.items():
        from PIL import Image

        result = analyze(model, Image.fromarray(photo(model.preprocess.input_hw[0])))
        rows.append({"model": name, "tokens": model.layout.num_tokens, "storage": result.storage, "bytes": result.nbytes})
    return rows


def ablation_cost(models: dict[str, LoadedModel], repeats: int) -> list[dict]:
    """Head ablation of one image (every head removed in turn, zero mode) against one analyze of it (forward and
    backward), alternated pair by pair. Forward passes and layer evaluations (one image through one layer) are
    counted for the branched passes and for one unbatched pass per head."""
    from PIL import Image

    rows = []
    for name, model in models.items():
        image = Image.fromarray(photo(model.preprocess.input_hw[0]))
        pixels = pixels_of(model, analyze(model, image))
        layers, heads = model.adapter.map_shape(model.module)
        result = {}

        def ablate() -> None:
            result["ablation"] = head_ablation(model, pixels)

        timing = paired_ratio(ablate, lambda: analyze(model, image), repeats)
        rows.append({"model": name, "layers": layers, "heads": heads, "forward_passes": result["ablation"].forward_passes,
                     "unbatched_forward_passes": 1 + layers * heads,
                     "layer_evaluations": layers + sum(layer + heads * (layers - layer) for layer in range(layers)),
                     "unbatched_layer_evaluations": layers * (1 + layers * heads),
                     "ablation_s": timing["numerator_s"], "analyze_s": timing["denominator_s"], "ratio": timing["ratio"]})
    return rows


def peak_rss_of_analyze(model: str, image_size: int) -> dict:
    """Peak resident memory of ``vit-explorer analyze`` in a fresh process."""
    from PIL import Image

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "image.png"
        Image.fromarray(photo(image_size)).save(path)
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        subprocess.run([sys.executable, "-m", "vit_explorer.cli", "analyze", str(path), "--model", model, "--out",
                        str(Path(folder) / "out")],
                       check=True, capture_output=True)
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"model": model, "peak_rss_mib": max(peak, before) / 1024}


def peak_rss_of_stats(model: str, image_size: int, counts: tuple[int, ...] = (500, 2000), batch_size: int = 32) -> list[dict]:
    """Peak resident memory of ``vit-explorer stats`` in a fresh process per image count: flat when no map
    outlives its batch. Each count lists the first images of one folder."""
    from PIL import Image

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for index in range(max(counts)):
            paths.append(Path(folder) / f"{index:05d}.png")
            Image.fromarray(photo(image_size, seed=index)).save(paths[-1])
        for count in counts:
            listing = Path(folder) / f"first-{count}.txt"
            listing.write_text("\n".join(str(path) for path in paths[:count]))
            command = [sys.executable, "-m", "vit_explorer", "stats", str(listing), "--model", model, "--out",
                       str(Path(folder) / f"out-{count}"),
                       "--batch-size", str(batch_size)]
            # a fresh interpreter per count, so the peak of one run does not hide behind an earlier one
            probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
                     "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
            peak_kib = int(subprocess.run([sys.executable, "-c", probe, *command], check=True, capture_output=True,
                                          text=True).stdout)
            rows.append({"model": model, "images": count, "peak_rss_mib": peak_kib / 1024})
    return rows


def start_up(model: str, repeats: int) -> dict:
    """Seconds from ``vit-explorer serve --no-browser`` to the first HTTP 200 / ``python -c "import torch, gradio"``."""
    sys.path.insert(0, str(ROOT / "tests"))
    from serving import free_port

    def serve_once() -> float:
        port = free_port()
        start = time.perf_counter()
        server = subprocess.Popen([sys.executable, "-m", "vit_explorer.cli", "serve", "--model", model, "--port", str(port),
                                   "--no-browser"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as response:
                        if response.status == 200:
                            return time.perf_counter() - start
                except OSError:
                    time.sleep(0.1)
                if server.poll() is not None or time.perf_counter() - start > 180:
                    raise RuntimeError("the app did not start")
        finally:
            server.terminate()
            server.wait(timeout=30)

    def imports() -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch, gradio"], check=True)
        return time.perf_counter() - start

    serve_s = statistics.median(serve_once() for _ in range(repeats))
    import_s = statistics.median(imports() for _ in range(repeats))
    return {"serve_to_first_response_s": serve_s, "import_torch_gradio_s": import_s, "ratio": serve_s / import_s}


def dataset_throughput(models: dict[str, LoadedModel], count: int, batch_size: int, repeats: int) -> list[dict]:
    """``vit-explorer stats`` throughput as a ratio to plain batched inference: the same images, the same
    DataLoader (decoding included in both), forward only; the two alternate, medians of ``repeats``."""
    from torch.utils.data import DataLoader

    from vit_explorer.methods.dataset import ImageDataset, collect, list_images

    rows = []
    for name, model in models.items():
        with tempfile.TemporaryDirectory() as folder:
            from PIL import Image

            for index in range(count):
                Image.fromarray(photo(model.preprocess.input_hw[0])).save(Path(folder) / f"{index:04d}.png")
            images = list_images(folder)

            def plain() -> None:
                for _, pixels, _, _ in DataLoader(ImageDataset(images, model.preprocess), batch_size=batch_size):
                    model.logits(pixels)

            def stats() -> None:
                collect(model, images, Path(folder) / "shards", batch_size=batch_size, show_progress=False)

            plain_s, stats_s = [], []
            for _ in range(repeats):
                for function, times in ((plain, plain_s), (stats, stats_s)):
                    start = time.perf_counter()
                    function()
                    times.append(time.perf_counter() - start)
            rows.append({"model": name, "images": count, "batch": batch_size,
                         "plain_img_per_s": count / statistics.median(plain_s),
                         "stats_img_per_s": count / statistics.median(stats_s),
                         "ratio": statistics.median(plain_s) / statistics.median(stats_s)})
    return rows


def table(title: str, rows: list[dict]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])
    lines = [f"\n{title}", " | ".join(keys), " | ".join("---" for _ in keys)]
    for row in rows:
        lines.append(" | ".join(f"{value:.4g}" if isinstance(value, float) else str(value) for value in row.values()))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="small sizes and few repetitions (smoke run)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results.json"))
    parser.add_argument("--only", default=None, help="comma-separated sections to run, merged into the results already in --out")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.tiny:
        repeats, tokens = 3, [50, 100]
        default = random_model(TINY, "tiny")
        capture_models = interaction_models = {"tiny": default}
        memory_models = {"tiny": default}
        grid = (3, 3)
        rss_model, rss_size = None, 0
    else:
        repeats, tokens = 9, [197, 577, 1370]
        default = load_model("builtin:shapes")
        vit_b = random_model(VIT_B16, "ViT-B/16 224 (random)")
        capture_models = interaction_models = {"builtin:shapes": default, "ViT-B/16 224 (random)": vit_b}
        memory_models = {**capture_models, "24L×16H 518/14, 1370 tokens (random)": random_model(VIT_L_518, "24x16")}
        grid = (12, 12)
        rss_model, rss_size = "builtin:shapes", 256
    sections = {
        "capture_overhead": lambda: capture_overhead(capture_models, [1, 8] if not args.tiny else [1, 2], repeats),
        "interaction_latency": lambda: interaction_latency(interaction_models, repeats),
        "class_maps": lambda: class_maps(interaction_models, repeats),
        "method_costs": lambda: method_costs(interaction_models, repeats),
        "decomposition_cost": lambda: decomposition_cost(interaction_models, repeats),
        "scoreboard": lambda: scoreboard_time(default, max(1, repeats // 3)),
        "rendering": lambda: [rendering(*grid, repeats)],
        "rollout_scaling": lambda: rollout_scaling(tokens, 12 if not args.tiny else 2, repeats),
        "memory": lambda: memory(memory_models),
        "ablation_cost": lambda: ablation_cost(interaction_models, max(1, repeats // 3)),
        "dataset_throughput": lambda: dataset_throughput(interaction_models, 16 if args.tiny else 128, 8 if args.tiny else 32,
                                                         2 if args.tiny else 3),
    }
    if rss_model is not None:
        sections.update({"peak_rss": lambda: [peak_rss_of_analyze(rss_model, rss_size)],
                         "start_up": lambda: [start_up(rss_model, 3)],
                         "stats_peak_rss": lambda: peak_rss_of_stats(rss_model, rss_size)})
    chosen = list(sections) if args.only is None else [name.strip() for name in args.only.split(",")]
    unknown = [name for name in chosen if name not in sections]
    if unknown:
        parser.error(f"unknown sections {', '.join(unknown)}; choose from {', '.join(sections)}")
    results = json.loads(Path(args.out).read_text()) if args.only is not None and Path(args.out).exists() else {}
    results["machine"] = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                          "cpus": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version()}
    for name in chosen:
        results[name] = sections[name]()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"machine: {results['machine']}")
    for key, rows in results.items():
        if key != "machine":
            print(table(key, rows))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
