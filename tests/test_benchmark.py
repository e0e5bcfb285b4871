"""The benchmark runs end to end at a tiny size, so it cannot rot. No timing is asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vit_explorer.tabs import TABS

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"


def test_tiny_benchmark_writes_every_section(tmp_path):
    out = tmp_path / "results.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    results = json.loads(out.read_text())
    assert {"machine", "capture_overhead", "interaction_latency", "class_maps", "rendering", "rollout_scaling", "memory",
            "dataset_throughput", "ablation_cost"} <= set(results)
    events = [row["event"] for row in results["interaction_latency"]]  # five controls, the upload, opening each tab
    assert len(events) == 6 + len(TABS) and sum(event.startswith("open tab: ") for event in events) == len(TABS)
    assert len(results["class_maps"]) == 3
    assert all(row["ratio_q1"] <= row["ratio"] <= row["ratio_q3"] and row["ratio_reused_output"] > 0 for row in results["capture_overhead"])
    for section in ("capture_overhead", "rendering", "rollout_scaling", "dataset_throughput"):
        assert all(row["ratio"] > 0 for row in results[section])
    assert all(row["forward_passes"] == 1 + row["layers"] and row["layer_evaluations"] < row["unbatched_layer_evaluations"]
               for row in results["ablation_cost"])
    assert "capture_overhead" in result.stdout
