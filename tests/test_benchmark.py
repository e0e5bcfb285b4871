"""The benchmark runs end to end at a tiny size, so it cannot rot. No timing is asserted."""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from vit_explorer.web.tabs import TABS

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"


def test_tiny_benchmark_writes_every_section(tmp_path):
    out = tmp_path / "results.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(out)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads(out.read_text())
    assert {"machine", "capture_overhead", "interaction_latency", "class_maps", "rendering", "rollout_scaling", "memory",
            "dataset_throughput", "ablation_cost", "method_costs", "scoreboard", "decomposition_cost"} <= set(results)
    events = [row["event"] for row in results["interaction_latency"]]  # five controls, the upload, opening each tab
    assert len(events) == 6 + len(TABS) and sum(event.startswith("open tab: ") for event in events) == len(TABS)
    assert len(results["class_maps"]) == 3
    # each written ratio is the one its stored timings give, recomputed here
    for row in results["capture_overhead"]:
        pairs = row["pair_ratios"]
        quartiles = statistics.quantiles(pairs, n=4) if len(pairs) > 1 else [pairs[0]] * 3
        assert row["ratio"] == statistics.median(pairs), row
        assert [row["ratio_q1"], row["ratio_q3"]] == [quartiles[0], quartiles[2]], row
    rendering = results["rendering"]
    for row in rendering if isinstance(rendering, list) else [rendering]:
        assert row["ratio"] == pytest.approx(row["numpy_s"] / row["matplotlib_s"]), row
    for row in results["method_costs"]:  # LeGrad and AttnLRP against one forward and backward pass
        pairs = row["pair_ratios"]
        assert row["method"] in ("LeGrad", "AttnLRP") and row["ratio"] == statistics.median(pairs), row
    assert results["scoreboard"][0]["methods"] == 6
    for row in results["decomposition_cost"]:  # the upload's pass with the decomposition against the same pass without
        added = row["pass_with_decomposition_s"] - row["pass_without_s"]
        assert row["pass_ratio"] == statistics.median(row["pair_ratios"]), row
        assert row["upload_ratio"] == pytest.approx(row["app_upload_s"] / (row["app_upload_s"] - added)), row
    for row in results["rollout_scaling"]:
        assert row["ratio"] == pytest.approx(row["row_s"] / row["full_s"]), row
        assert row["ratio_with_factors"] == pytest.approx((row["row_s"] + row["factors_s"]) / row["full_s"]), row
    for row in results["dataset_throughput"]:
        assert row["ratio"] == pytest.approx(row["stats_img_per_s"] / row["plain_img_per_s"]), row
    assert all(row["forward_passes"] == 1 + row["layers"] and row["layer_evaluations"] < row["unbatched_layer_evaluations"]
               for row in results["ablation_cost"])
    assert "capture_overhead" in result.stdout


@pytest.mark.browser
def test_the_browser_benchmark_splits_an_upload_and_a_click(tmp_path):
    """One upload and one patch click after the warm-up, in Chromium: each split into its parts, with one analysis per
    upload and one event per click (on a patch, on a tile) seen by the server; the maps shown from their quick answers
    first."""
    pytest.importorskip("playwright.sync_api")
    out = tmp_path / "browser.json"
    script = SCRIPT.parent / "browser_latency.py"
    arguments = [sys.executable, str(script), "--uploads", "1", "--clicks", "1", "--out", str(out)]
    result = subprocess.run(arguments, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    (measured,) = json.loads(out.read_text()).values()
    (upload,), (click,), (tile,) = measured["uploads"], measured["clicks"], measured["tiles"]
    assert [event["fn_name"] for event in upload["events"]].count("analyze") == 1
    assert [event["fn_name"] for event in click["events"]] == ["select_patch"]
    assert [event["fn_name"] for event in tile["events"]] == ["select_tile"]
    for row in (upload, click, tile):
        assert row["until_request_sent_s"] > 0 and row["main_event_server_s"] > 0
        assert row["server_fn_call_s"] <= row["main_event_server_s"] + 1e-3
    # the maps come from the quick answer, asked for at the file or the press, before Gradio's event request leaves; the
    # upload's event takes its analysis (no model pass of its own)
    for row in (upload, click, tile):
        assert abs(row["quick_answer_sent_s"]) < 0.05 and 0 < row["quick_answer_round_trip_s"] < row["browser_total_s"]
        assert row["browser_total_s"] < row["until_request_sent_s"]
    assert upload["callback_quick answer (analysis, drawing and files)_s"] > 0 and "callback_model pass (analyze)_s" not in upload
    assert click["callback_quick answer (drawing and files)_s"] > 0
