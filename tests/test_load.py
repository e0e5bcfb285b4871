"""Load and a long session on a served app, through gradio_client on loopback.

Sizes fit CI (a few minutes); ``--load-analyses 25 --soak-updates 500`` runs the larger setting.
Latencies are reported (printed and written to test-output/), never asserted.
"""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import CLI_MODEL, photo, write_checkpoint
from PIL import Image
from serving import rss_mib, running_server

from vit_explorer import analyze, load_model
from vit_explorer.draw import pictures
from vit_explorer.web.session import CONTROL_NAMES, Controls

pytestmark = pytest.mark.slow
gradio_client = pytest.importorskip("gradio_client")
# every view control's default, as the API takes them (a gr.State, the comparison, is not an API parameter)
CONTROLS = tuple(getattr(Controls(), name) for name in CONTROL_NAMES if name != "comparison")
OUTPUT = Path(__file__).resolve().parent.parent / "test-output"
CLIENTS = 4


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def report(name: str, figures: dict) -> None:
    OUTPUT.mkdir(exist_ok=True)
    (OUTPUT / f"{name}.json").write_text(json.dumps(figures, indent=2))
    print(f"\n{name}: {json.dumps(figures)}")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("load") / "load.safetensors", CLI_MODEL)


def client_images(folder: Path, client: int, count: int = 3) -> list[Path]:
    paths = []
    for index in range(count):
        path = folder / f"client{client}-{index}.png"
        photo((256 + 16 * index, 240), seed=100 * client + index).save(path)
        paths.append(path)
    return paths


def test_concurrent_clients_each_get_their_own_answers(checkpoint, tmp_path, request):
    analyses = request.config.getoption("--load-analyses")
    model = load_model(str(checkpoint))
    images = {client: client_images(tmp_path, client) for client in range(CLIENTS)}
    # what each image must give: its top-5 and the image as the model saw it
    expected = {}
    for paths in images.values():
        for path in paths:
            analysis = analyze(model, path)
            expected[path] = ({p.label: p.prob for p in analysis.top_k(5)}, pictures.image_picture(analysis, 0))

    def run_client(client: int) -> tuple[list[float], list[float], list[str]]:
        session = gradio_client.Client(url, verbose=False, download_files=str(tmp_path / f"downloads{client}"))
        analyse_s, update_s, wrong = [], [], []
        for step in range(analyses):
            path = images[client][step % len(images[client])]
            start = time.perf_counter()
            outputs = session.predict(gradio_client.handle_file(str(path)), *CONTROLS, api_name="/analyze")
            analyse_s.append(time.perf_counter() - start)
            # shown or hidden with its value
            label = outputs[2]["value"] if outputs[2].get("__type__") == "update" else outputs[2]
            top5 = {entry["label"]: entry["confidence"] for entry in label["confidences"]}
            want_top5, want_image = expected[path]
            if top5.keys() != want_top5.keys() or not np.allclose(list(top5.values()), [want_top5[k] for k in top5], atol=1e-5):
                wrong.append(f"client {client} step {step}: top-5 {top5} is not that of {path.name}")
            start = time.perf_counter()
            updated = session.predict(*CONTROLS, api_name="/reset_query")  # re-rendered from this session's state
            update_s.append(time.perf_counter() - start)
            if not np.array_equal(np.asarray(Image.open(updated[0]).convert("RGB")), want_image):
                wrong.append(f"client {client} step {step}: the session's state shows another image than {path.name}")
        return analyse_s, update_s, wrong

    with running_server(str(checkpoint), tmp_path / "server.log") as (url, server), ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(run_client, range(CLIENTS)))
        assert server.poll() is None  # still serving
    wrong = [line for _, _, lines in results for line in lines]
    assert wrong == []
    analyse_s = [seconds for seconds, _, _ in results for seconds in seconds]
    update_s = [seconds for _, seconds, _ in results for seconds in seconds]
    assert len(analyse_s) == len(update_s) == CLIENTS * analyses
    report("load", {"clients": CLIENTS, "analyses_per_client": analyses,
                    "analyse_p50_s": statistics.median(analyse_s), "analyse_p95_s": percentile(analyse_s, 0.95),
                    "update_p50_s": statistics.median(update_s), "update_p95_s": percentile(update_s, 0.95)})


def test_a_long_session_keeps_memory_flat(checkpoint, tmp_path, request):
    updates = request.config.getoption("--soak-updates")
    images = client_images(tmp_path, 0, count=4)
    events = [
        ("/set_colormap", lambda step: (["inferno", "viridis", "magma"][step % 3], *CONTROLS[1:])),
        ("/set_order_heads_by",
         lambda step: (*CONTROLS[:3], ["entropy", "distance", "prefix share", "gradient importance"][step % 4], *CONTROLS[4:])),
        ("/set_discard_ratio", lambda step: (*CONTROLS[:5], (step % 10) / 10, *CONTROLS[6:])),
        ("/select_query", lambda step: ("mean of patch queries" if step % 2 else "cls", *CONTROLS)),
        ("/set_method", lambda step: (*CONTROLS[:8], ["relevance", "grad-rollout", "rollout", "cls"][step % 4])),
        ("/set_target", lambda step: (step % 4, *CONTROLS)),
        ("/reset_query", lambda step: CONTROLS),
        # only the open tab draws: open each in turn, so that every view is drawn again and again
        ("/open_layers_heads", lambda step: CONTROLS),
        ("/open_rollout", lambda step: CONTROLS),
        ("/open_class_maps", lambda step: CONTROLS),
        ("/open_head_statistics", lambda step: CONTROLS),
        ("/open_overview", lambda step: CONTROLS),
    ]
    samples = []
    with running_server(str(checkpoint), tmp_path / "server.log") as (url, server):
        session = gradio_client.Client(url, verbose=False, download_files=str(tmp_path / "downloads"))
        for step in range(updates):
            if step % 25 == 0:  # a new image now and then: the previous analysis must be let go
                session.predict(gradio_client.handle_file(str(images[(step // 25) % len(images)])), *CONTROLS,
                                api_name="/analyze")
            endpoint, arguments = events[step % len(events)]
            session.predict(*arguments(step), api_name=endpoint)
            if step % 10 == 0:
                samples.append(rss_mib(server))
        assert server.poll() is None
    warm = samples[len(samples) // 4]  # after the caches and the allocator have settled
    growth = max(samples[len(samples) // 4 :]) - warm
    report("soak",
           {"updates": updates, "rss_samples_mib": [round(sample, 1) for sample in samples], "rss_after_warm_up_mib": warm,
                    "growth_after_warm_up_mib": growth})
    assert growth < 150, f"RSS grew by {growth:.0f} MiB after warm-up: {samples}"
