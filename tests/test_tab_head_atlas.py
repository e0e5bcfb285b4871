"""The Head atlas tab: an atlas folder loaded, its grid, a head clicked."""

import json

import gradio as gr
import numpy as np
import pytest
from app_support import click

from vit_explorer import load_model
from vit_explorer.cli import main
from vit_explorer.core.analysis import analyze, class_evidence
from vit_explorer.core.targets import Prompts, prompt_model
from vit_explorer.draw import files, pictures
from vit_explorer.web.session import ModelCache
from vit_explorer.web.tabs import head_atlas


@pytest.fixture(scope="module")
def atlas_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tab-atlas")
    assert main(["make-shapes", str(folder / "set"), "--count", "10", "--seed", "3"]) in (0, None)
    assert main(["atlas", str(folder / "set" / "images"), "--model", "builtin:shapes-clip", "--out", str(folder / "atlas"),
                 "--texts-per-head", "2"]) in (0, None)
    return folder / "atlas"


def test_loading_an_atlas_selects_the_head_that_writes_most_and_a_click_selects_another(atlas_folder):
    models = ModelCache()
    loaded, summary, grid, head_text, gallery = head_atlas.on_load(models, f"  {atlas_folder}  ")
    record = files.read_atlas(atlas_folder)
    strongest = max(record["heads"], key=lambda entry: entry["mean_abs_contribution"])
    assert loaded.head == (strongest["layer"], strongest["head"]) and "over **10 images**" in summary
    assert "Completeness" in summary and f"Layer {strongest['layer']}, head h{strongest['head']}" in head_text
    assert f"“{strongest['texts'][0]}”" in head_text and "not what it means" in head_text
    assert isinstance(grid, np.ndarray) and len(gallery["value"]) == len(strongest["top_images"])
    thumbnails = [picture for picture, _ in gallery["value"]]
    assert all(picture.ndim == 3 and max(picture.shape[:2]) <= head_atlas.THUMBNAIL_PX for picture in thumbnails)
    # each top image with the patches the head writes from: its own decomposition of its best prompt, made apart
    prompted = prompt_model(load_model("builtin:shapes-clip", device="cpu"), Prompts(tuple(record["answers"])))
    analysis = analyze(prompted, strongest["top_images"][0], decompose=True)
    decomposition = class_evidence(prompted, analysis, decompose=True).decomposition
    expected = pictures.head_split_thumbnail(analysis, decomposition, *loaded.head, head_atlas.THUMBNAIL_PX)
    np.testing.assert_array_equal(thumbnails[0], expected)

    y, x = loaded.geometry.tile_origin(0, 1)
    again, _, regrid, other_text, _ = head_atlas.on_select(models, click(x + 3, y + 3), loaded)
    assert again.head == (0, 1) and "Layer 0, head h1" in other_text and not np.array_equal(regrid, grid)
    unchanged = head_atlas.on_select(models, click(0, 0), loaded)  # the corner: a label
    assert unchanged[0] is loaded and unchanged[1] == gr.update()
    assert head_atlas.on_select(models, click(5, 5), None)[0] is None  # nothing loaded yet


def test_a_folder_without_an_atlas_is_a_message(tmp_path):
    with pytest.raises(gr.Error, match="no atlas in"):
        head_atlas.on_load(ModelCache(), str(tmp_path))
    (tmp_path / "atlas.json").write_text('{"model": "m"}')
    with pytest.raises(gr.Error, match="not an atlas written by vit-explorer atlas"):
        head_atlas.on_load(ModelCache(), str(tmp_path))


def test_an_atlas_whose_model_does_not_load_shows_its_images_alone(atlas_folder, tmp_path):
    record = json.loads((atlas_folder / "atlas.json").read_text(encoding="utf-8"))
    record["model"] = record["spec"] = str(tmp_path / "gone.safetensors")
    (tmp_path / "moved").mkdir()
    (tmp_path / "moved" / "atlas.json").write_text(json.dumps(record), encoding="utf-8")
    _, _, _, head_text, gallery = head_atlas.on_load(ModelCache(), str(tmp_path / "moved"))
    assert "does not load here" in head_text and len(gallery["value"]) == len(record["heads"][0]["top_images"])


def test_an_atlas_computed_in_the_page_is_the_command_s_and_old_ones_are_removed(atlas_folder, tmp_path, monkeypatch):
    import os
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    images = atlas_folder.parent / "set" / "images"
    models = ModelCache()
    loaded, summary, *_ = head_atlas.on_compute(models, "builtin:shapes", str(images), "")
    assert "**builtin:shapes** over **10 images**" in summary and loaded.record["spec"] == "builtin:shapes"
    assert main(["atlas", str(images), "--model", "builtin:shapes", "--out", str(tmp_path / "cli")]) in (0, None)
    expected = files.read_atlas(tmp_path / "cli")
    assert [entry["mean_abs_contribution"] for entry in loaded.record["heads"]] == pytest.approx(
        [entry["mean_abs_contribution"] for entry in expected["heads"]], rel=1e-5)
    written = list((tmp_path / "temp" / "vit-explorer-exports").glob("atlas-*"))
    assert len(written) == 1 and (written[0] / "atlas.json").is_file()
    os.utime(written[0], (0, 0))  # an hour past its time: the next use of the folder removes it
    head_atlas.on_compute(models, "builtin:shapes", str(images), "")
    assert written[0].exists() is False
    with pytest.raises(gr.Error, match="no image|no images|not a folder|cannot"):
        head_atlas.on_compute(models, "builtin:shapes", str(tmp_path / "temp"), "")
