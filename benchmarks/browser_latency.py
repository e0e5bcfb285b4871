"""Where the time of an upload and of a patch click goes, in real Chromium against the real app.

Serves the app in this process (so that its stages can be timed), drives headless Chromium through Playwright, and
splits each interaction into:

- browser: from the file handed to the page (or the click) to the first animation frame that shows the new map,
  loaded (``WATCH``): what the user waits for;
- the file's upload (the page's POST, from the browser's resource timing);
- per server event (Gradio's own profiling, ``GRADIO_PROFILING=1``): queue wait, pre-processing, the callback, and
  post-processing (which includes encoding each returned picture to a file in Gradio's cache);
- inside the callback: the model's pass (``analyze``) and the drawing (every ``vit_explorer.draw`` call, outermost
  only), the rest being captions and bookkeeping;
- the time before the page sends the event's request (Gradio's client), and from the event's end on the server to
  the picture on screen (the result's transfer, the page's update, the picture's fetch, decoding and paint), from
  the clocks of this one machine.

    python benchmarks/browser_latency.py [--model builtin:shapes] [--input-size PX] [--uploads 5] [--clicks 5] [--out FILE]

Clicks are patch clicks on the query image, then as many clicks on tiles of the layers × heads grid.

Each figure is a median over the interactions of one run; the machine is named in the output. Not for CI's suite
beyond a smoke run (``tests/test_benchmark.py``).
"""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_PROFILING", "1")  # read by Gradio at import
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the browser tests' helpers: Debian's Chromium, the natural-pixel click

from serving import chromium_page, click_natural, free_port  # noqa: E402

from vit_explorer import run  # noqa: E402
from vit_explorer.core.analysis import analyze  # noqa: E402
from vit_explorer.core.maps import heads_view  # noqa: E402
from vit_explorer.draw import charts, pictures, plots, render  # noqa: E402
from vit_explorer.web import app as web_app  # noqa: E402
from vit_explorer.web import quick_answer  # noqa: E402
from vit_explorer.web.session import ModelCache  # noqa: E402

# when the user's action reached the page: the file input's change, the pointer's press on the picture
MARK_INPUT = """() => {
    window.__input = null;
    performance.clearResourceTimings();  // the buffer holds 250 entries: the earlier interactions' would fill it
    const mark = () => {
        if (window.__input === null) window.__input = [performance.now(), performance.timeOrigin + performance.now()];
    };
    // on the window, the first to see an event: the page's quick answers hold the file's change back from the document
    window.addEventListener('change', mark, {capture: true, once: true});
    window.addEventListener('pointerdown', mark, {capture: true, once: true});
}"""

# the first frame that shows the element's <img> with a new picture, loaded, in the page's clock. It waits on the page's
# own events (a changed src, the picture's load), then one animation frame: polling every frame would keep the page
# drawing frames, which took a core from the model on this 2-core machine (DINOv2's pass at 518 px: 1.37 s, not 1.0)
WATCH = """([elemId, before]) => new Promise((resolve) => {
    const box = document.querySelector(`#${elemId}`);
    const shown = () => requestAnimationFrame(() => resolve(
        {shown: performance.now(), epoch: performance.timeOrigin + performance.now(), src: box.querySelector('img').src}));
    const check = () => {
        const img = box.querySelector('img');
        if (!img || !img.src || img.src === before) return;
        observer.disconnect();
        if (img.complete && img.naturalWidth > 0) shown();
        else img.addEventListener('load', shown, {once: true});
    };
    const observer = new MutationObserver(check);
    observer.observe(box, {subtree: true, childList: true, attributes: true, attributeFilter: ['src']});
    check();
})"""


# the event's own picture is on the page (not a quick answer's): the next interaction starts from a settled page
SETTLED = "(elemId) => (document.querySelector(`#${elemId} img`)?.src || '').includes('/file=')"


class Stages:
    """Seconds spent in the timed stages of the server's callbacks since the last ``take``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.depth = threading.local()

    def timed(self, stage: str, function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            depth = getattr(self.depth, "value", 0)
            self.depth.value = depth + 1
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.depth.value = depth
                if depth == 0:  # outermost only: a drawing that calls another is counted once
                    self.seconds[stage] += time.perf_counter() - start

        return wrapper

    def take(self) -> dict[str, float]:
        taken, self.seconds = dict(self.seconds), defaultdict(float)
        return taken


def instrument(stages: Stages) -> None:
    """Time the model's pass and every public drawing function, where the app's callbacks call them."""
    run.analyze = stages.timed("model pass (analyze)", run.analyze)
    quick_answer.quick_views = stages.timed("quick answer (drawing and files)", quick_answer.quick_views)
    quick_answer.tile_views = stages.timed("quick answer (drawing and files)", quick_answer.tile_views)
    quick_answer.QuickAnswers.uploaded_views = stages.timed("quick answer (analysis, drawing and files)",
                                                            quick_answer.QuickAnswers.uploaded_views)
    for module in (pictures, charts, plots, render):
        for name, function in list(vars(module).items()):
            if callable(function) and getattr(function, "__module__", None) == module.__name__ and not name.startswith("_") \
                    and not isinstance(function, type):
                setattr(module, name, stages.timed("drawing", function))


def server_traces(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}gradio_api/profiling/traces") as response:
        return json.loads(response.read())


def finished(url: str, event: str, timeout_s: float = 120.0) -> None:
    """Wait until the server has run ``event`` since the traces were cleared."""
    deadline = time.monotonic() + timeout_s
    while not any(trace["fn_name"] == event for trace in server_traces(url)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server did not run {event} within {timeout_s} s")
        time.sleep(0.05)


def clear_traces(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{url}gradio_api/profiling/clear", method="POST")).close()


def resources(page, since: float) -> list[dict]:
    return page.evaluate("""(since) => performance.getEntriesByType('resource').filter((entry) => entry.startTime >= since)
        .map((entry) => ({name: entry.name, start: entry.startTime, end: entry.responseEnd}))""", since)


IDENTIFIERS = ("session_hash", "event_id", "timestamp")


def split(browser_s: float, traces: list[dict], stages: dict[str, float], fetched: list[dict], upload_s: float,
          main_event: str, start_ms: float, start_epoch: float, shown_epoch: float) -> dict:
    """One interaction's time, by part (seconds). The event ``main_event`` draws the map: the time until it reached
    the server's queue (after the upload, for an upload) and the time from its end to the map on screen (the result's
    transfer, the page's update, the picture's fetch, decoding and paint) come from the clocks of this one machine."""
    row = {"browser_total_s": browser_s, "upload_post_s": upload_s}
    main = [trace for trace in traces if trace["fn_name"] == main_event]
    if main:
        enqueued = main[0]["timestamp"] - main[0]["queue_wait_ms"] / 1000
        row["until_event_queued_s"] = enqueued - start_epoch
        row["main_event_server_s"] = main[0]["total_ms"] / 1000 + main[0]["queue_wait_ms"] / 1000
        row["after_main_event_s"] = shown_epoch - (main[0]["timestamp"] + main[0]["total_ms"] / 1000)
        row["until_main_event_done_s"] = main[0]["timestamp"] + main[0]["total_ms"] / 1000 - start_epoch
    for key in ("queue_wait", "preprocess", "fn_call", "postprocess", "postprocess_save_img_array_to_cache"):
        row[f"server_{key}_s"] = sum(trace.get(f"{key}_ms", 0.0) for trace in traces) / 1000
    row["server_events"] = len(traces)
    row.update({f"callback_{name}_s": value for name, value in stages.items()})
    joins = [entry for entry in fetched if "/queue/join" in entry["name"]]
    if joins:  # the first event's request leaving the page (the upload's file is sent before it)
        row["until_request_sent_s"] = (joins[0]["start"] - start_ms) / 1000
    row["pictures_fetched"] = sum("/file=" in entry["name"] for entry in fetched)
    routes = (quick_answer.CLICK_ROUTE, quick_answer.TILE_ROUTE, quick_answer.UPLOAD_ROUTE)
    quick = [entry for entry in fetched if any(route in entry["name"] for route in routes)]
    if quick:  # a quick answer (``web.quick_answer``): its request's start after the click or the file, and its round trip
        row["quick_answer_sent_s"] = (quick[0]["start"] - start_ms) / 1000
        row["quick_answer_round_trip_s"] = (quick[0]["end"] - quick[0]["start"]) / 1000
    row["events"] = [{key: value for key, value in trace.items() if value and key not in IDENTIFIERS} for trace in traces]
    return row


def medians(rows: list[dict]) -> dict:
    keys = {key for row in rows for key in row if key != "events"}
    return {key: statistics.median(row.get(key, 0.0) for row in rows) for key in sorted(keys)}


def photo(seed: int, size: int = 256) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).resize((size, size), Image.Resampling.BICUBIC)


def measure(model_spec: str, uploads: int, clicks: int, input_hw: tuple[int, int] | None = None) -> dict:
    stages = Stages()
    instrument(stages)
    models = ModelCache(input_hw=input_hw)
    models.get(model_spec)
    print(f"loaded {model_spec}", file=sys.stderr, flush=True)
    forward = model_forward_s(models.get(model_spec))
    demo = web_app.build_demo(model_spec, models)
    demo.queue(default_concurrency_limit=4)
    port = free_port()
    web_app.launch(demo, server_name="127.0.0.1", server_port=port, quiet=True)
    url = f"http://127.0.0.1:{port}/"
    upload_rows, click_rows, tile_rows = [], [], []
    try:
        with tempfile.TemporaryDirectory() as folder, chromium_page() as (page, errors):
            page.goto(url)
            page.wait_for_selector("#upload input[type=file]", state="attached", timeout=30_000)
            for number in range(uploads + 1):  # the first warms up the page, the model and the caches
                path = Path(folder) / f"upload-{number}.png"
                photo(100 + number).save(path)
                before = page.evaluate("() => document.querySelector('#overview-rollout img')?.src || ''")
                clear_traces(url)
                stages.take()
                page.evaluate(MARK_INPUT)
                page.locator("#upload input[type=file]").set_input_files(str(path))
                shown = page.evaluate(WATCH, ["overview-rollout", before])
                start, start_epoch = page.evaluate("() => window.__input")
                finished(url, "analyze_open_tab")  # every stage and the events that follow the maps have ended
                page.wait_for_function(SETTLED, arg="overview-rollout", timeout=30_000)
                fetched = resources(page, start)
                posts = [entry for entry in fetched if "/upload" in entry["name"]]
                upload_s = (posts[0]["end"] - posts[0]["start"]) / 1000 if posts else 0.0
                row = split((shown["shown"] - start) / 1000, server_traces(url), stages.take(), fetched, upload_s, "analyze",
                            start, start_epoch / 1000, shown["epoch"] / 1000)
                print(f"upload {number}: {row['browser_total_s'] * 1000:.0f} ms", file=sys.stderr, flush=True)
                if number:
                    upload_rows.append(row)
            page.get_by_role("tab", name="Layers × heads").click()
            page.wait_for_selector("#head-view img", timeout=30_000)
            page.wait_for_timeout(500)
            width = page.locator("#query-image img").first.evaluate("(img) => img.naturalWidth")
            # clicking through heads too: tiles of the grid, laid out as the grid was drawn for this model
            analysis = analyze(models.get(model_spec), photo(0))
            _, geometry = pictures.grid_picture(analysis, heads_view(analysis, 0))
            layers, heads = models.get(model_spec).map_shape
            for number in range(clicks + 1):
                at = ((number * 37) % max(1, width - 20) + 10, (number * 53) % max(1, width - 20) + 10)
                row = timed_click(page, url, stages, "query-image", at, "select_patch")
                print(f"click {number}: {row['browser_total_s'] * 1000:.0f} ms", file=sys.stderr, flush=True)
                click_rows += [row] if number else []
            for number in range(clicks + 1):
                y, x = geometry.tile_origin((number * 5) % layers, (number * 3 + 1) % heads)
                row = timed_click(page, url, stages, "grid", (x + geometry.tile / 2, y + geometry.tile / 2), "select_tile")
                print(f"tile {number}: {row['browser_total_s'] * 1000:.0f} ms", file=sys.stderr, flush=True)
                tile_rows += [row] if number else []
            assert not errors, errors
    finally:
        demo.close()
    return {"model": model_spec, "forward_s": forward, "upload": medians(upload_rows), "click": medians(click_rows),
            "tile": medians(tile_rows), "uploads": upload_rows, "clicks": click_rows, "tiles": tile_rows}


def timed_click(page, url: str, stages: Stages, elem_id: str, at: tuple[float, float], event: str) -> dict:
    """One click on the picture ``elem_id`` at its natural pixel ``at``, timed until the large head view shows its
    answer (``split``, ``event`` the server's event for it); returns once the page has settled."""
    before = page.evaluate("() => document.querySelector('#head-view img')?.src || ''")
    clear_traces(url)
    stages.take()
    page.evaluate(MARK_INPUT)
    click_natural(page, elem_id, *at)
    shown = page.evaluate(WATCH, ["head-view", before])
    start, start_epoch = page.evaluate("() => window.__input")
    finished(url, event)
    page.wait_for_function(SETTLED, arg="head-view", timeout=30_000)
    return split((shown["shown"] - start) / 1000, server_traces(url), stages.take(), resources(page, start), 0.0, event, start,
                 start_epoch / 1000, shown["epoch"] / 1000)


def model_forward_s(model, repeats: int = 9) -> float:
    pixels = torch.randn(1, 3, *model.preprocess.input_hw)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        with torch.inference_mode():
            model.module(pixels)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:shapes")
    parser.add_argument("--uploads", type=int, default=5)
    parser.add_argument("--clicks", type=int, default=5)
    parser.add_argument("--input-size", type=int, default=None, help="the model's input size, where it allows one")
    parser.add_argument("--out", default=None, help="add the figures to this JSON file, under the model's spec")
    args = parser.parse_args()
    result = measure(args.model, args.uploads, args.clicks, None if args.input_size is None else (args.input_size,) * 2)
    result["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__}
    for kind in ("upload", "click", "tile"):
        print(f"\n{kind} ({args.model}; plain forward {result['forward_s'] * 1000:.0f} ms), medians:")
        for key, value in result[kind].items():
            print(f"  {key:45s} {value * 1000 if key.endswith('_s') else value:9.1f}{' ms' if key.endswith('_s') else ''}")
    if args.out:  # one file for every model measured, each under its spec and input size
        out = Path(args.out)
        merged = json.loads(out.read_text()) if out.exists() else {}
        merged[f"{args.model} @ {args.input_size or 'default'} px"] = result
        out.write_text(json.dumps(merged, indent=2))


if __name__ == "__main__":
    main()
