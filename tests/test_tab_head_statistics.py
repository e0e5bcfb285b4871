"""The Head statistics tab: its plots, the top-heads table and a dataset's statistics beside this image's."""


import gradio as gr
import numpy as np
import pytest
from app_support import (
    STATISTICS,
    analysed,
    controls,
    opened,
)
from conftest import write_stats_folder

from vit_explorer.core import maps
from vit_explorer.draw import plots
from vit_explorer.web import app


def test_statistics_plots_fit_their_axes_to_the_data():
    """No plot fixes its vertical axis when built: each drawing fits it to its data (with room for whole markers), so a
    prefix share of about 0.01 fills its plot rather than sitting on 0…1."""
    demo = app.build_demo("builtin:shapes")
    plots_by_id = {block.elem_id: block for block in demo.blocks.values() if isinstance(block, gr.ScatterPlot)}
    compared = plots_by_id.pop("compare-plot")  # the Compare tab's: both sides against relative depth
    assert compared.y_lim is None and compared.tooltip == "all" and compared.x == "depth" and compared.color == "side"
    assert set(plots_by_id) == {"distance-plot", "entropy-plot", "prefix-plot", "importance-plot"}
    for plot in plots_by_id.values():
        assert plot.y_lim is None and plot.tooltip != "none" and plot.x == "layer" and plot.color == "head"


def test_head_table_has_one_row_per_head():
    values = np.arange(6, dtype=np.float32).reshape(2, 3)  # [layers, heads]
    table = plots.head_table(values)
    expected = [("L0", "h0", 0.0), ("L1", "h0", 3.0), ("L0", "h1", 1.0), ("L1", "h1", 4.0), ("L0", "h2", 2.0), ("L1", "h2", 5.0)]
    assert list(table.itertuples(index=False, name=None)) == expected


def test_a_stats_folder_puts_the_dataset_means_beside_this_images_heads(models, upload, checkpoint, tmp_path):
    import csv
    import json

    from vit_explorer.methods.dataset import read_statistics

    session, _ = analysed(models, upload, checkpoint)
    write_stats_folder(models.get(checkpoint), tmp_path)
    summary = json.loads((tmp_path / "stats" / "summary.json").read_text())
    with open(tmp_path / "stats" / "heads.csv", newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["statistic"] == "distance"]

    views = opened(STATISTICS, session, controls(stats_folder=str(tmp_path / "stats")))
    chart = views["dataset_chart"]
    assert chart["visible"] and isinstance(chart["value"], np.ndarray) and chart["value"].shape[2] == 3
    assert list(views["distance_plot"]["value"].columns) == ["layer", "head", "value"]  # the interactive plots stay this image's
    dataset = read_statistics(tmp_path / "stats")
    np.testing.assert_allclose(dataset.mean["distance"], np.asarray(summary["statistics"]["distance"]["mean"]))  # [layers, heads]
    for row in rows:
        assert dataset.low["distance"][int(row["layer"]), int(row["head"])] == pytest.approx(float(row["q05"]))
    image_values = maps.ranking_values(session.analysis, "distance", session.evidence)
    outside = sum(not float(row["q05"]) <= image_values[int(row["layer"]), int(row["head"])] <= float(row["q95"]) for row in rows)
    note = views["dataset_note"]
    assert "3 images of `three photos`" in note
    assert (f"distance: {outside} heads outside" in note) if outside else ("distance: every head within" in note)

    wrong = opened(STATISTICS, session, controls(stats_folder=str(tmp_path)))  # no summary.json there
    assert "is not a folder written by `vit-explorer stats`" in wrong["dataset_note"]
    assert wrong["dataset_chart"]["visible"] is False
    # statistics of a 12-layer model: every row again, six layers down
    (tmp_path / "stats" / "summary.json").write_text(json.dumps({**summary, "layers_heads": [12, 4]}))
    with open(tmp_path / "stats" / "heads.csv", newline="") as handle:
        all_rows = list(csv.DictReader(handle))
    with open(tmp_path / "stats" / "heads.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(all_rows[0]))
        writer.writeheader()
        writer.writerows(all_rows + [{**row, "layer": str(int(row["layer"]) + 6)} for row in all_rows])
    mismatched = opened(STATISTICS, session, controls(stats_folder=str(tmp_path / "stats")))
    assert "this model has 6 × 4" in mismatched["dataset_note"]
