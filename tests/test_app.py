"""The app's callbacks, called directly (no server): what each event shows, and that only uploads run the model."""

import zipfile
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
from conftest import CLI_MODEL, photo, write_checkpoint

from vit_explorer import app


@pytest.fixture
def checkpoint(tmp_path):
    return str(write_checkpoint(tmp_path / "six.safetensors", CLI_MODEL))


@pytest.fixture
def models():
    return app.ModelCache()


@pytest.fixture
def upload(tmp_path):
    path = tmp_path / "upload.png"
    photo((300, 200), seed=5).save(path)
    return str(path)


CONTROLS = tuple(app.Controls().__dict__.values())


def forward_counter(models, spec):
    calls = []
    models.get(spec).module.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def click(x, y):
    return gr.SelectData(None, {"index": [x, y], "value": None, "selected": True})


def analysed(models, upload, checkpoint):
    outputs = app.run_analysis(models, upload, checkpoint, *CONTROLS)
    return outputs[0], outputs


def test_upload_fills_every_view(models, upload, checkpoint):
    session, outputs = analysed(models, upload, checkpoint)
    assert session.analysis.attentions.shape == (6, 4, 257, 257)
    assert session.query == 0 and session.layer == 5 and session.head is None
    summary, image, top5, rollout, last, grid, head, rollout_view, *charts = outputs[1:12]
    assert "6 layers × 4 heads" in summary and "16×16 patches" in summary
    assert len(top5) == 4 and abs(sum(top5.values()) - 1) < 1e-5
    for picture in (image, rollout, last, grid, head, rollout_view, *charts):
        assert isinstance(picture, np.ndarray) and picture.ndim == 3 and picture.shape[2] == 3


def test_controls_patch_and_tile_clicks_rerender_without_a_forward_pass(models, upload, checkpoint):
    session, outputs = analysed(models, upload, checkpoint)
    calls = forward_counter(models, checkpoint)
    grid_before, head_before = outputs[6], outputs[7]

    height, width = app.pictures.view_hw(session.analysis)
    session, image, grid, head, rollout, caption, grid_text, query = app.on_patch_click(models, click(2, height - 2), session, *CONTROLS)
    assert session.query == session.analysis.layout.patch_token(15, 0) and "patch at row 15, col 0" in caption
    assert query["value"] == "patch at row 15, col 0" and query["value"] in query["choices"]  # the dropdown shows the patch
    assert "patch at row 15, col 0" in grid_text and "layer 5, mean of heads" in grid_text
    assert not np.array_equal(grid, grid_before) and not np.array_equal(head, head_before)
    back = app.on_query_choice(session, "cls", *CONTROLS)
    assert back[0].query == 0 and back[-1]["value"] == "cls" and back[-1]["choices"] == ["cls", app.MEAN_PATCHES]
    again = app.on_query_choice(session, "patch at row 15, col 0", *CONTROLS)  # the patch entry itself: the query stays
    assert again[0].query == session.query and again[-1]["value"] == "patch at row 15, col 0"

    y, x = session.geometry.tile_origin(2, 3)
    session, grid_selected, head_selected, grid_text, layer, head_choice = app.on_tile_click(click(x + 5, y + 5), session, *CONTROLS)
    assert (session.layer, session.head) == (2, 3) and layer["value"] == 2 and head_choice["value"] == "h3"
    assert "layer 2, head h3" in grid_text
    assert not np.array_equal(grid_selected, grid) and not np.array_equal(head_selected, head)

    viridis = app.Controls(cmap="viridis", overlay=False, normalisation="shared", order_by="entropy")
    recoloured = app.on_controls(session, *viridis.__dict__.values())
    assert not np.array_equal(recoloured[2], grid_selected)
    for options in ({"head_fusion": "max"}, {"discard_ratio": 0.5}, {"start_layer": 3}, {"residual_weight": 0.1}):
        changed, class_view = app.on_rollout_controls(session, *app.Controls(**options).__dict__.values())
        assert not np.array_equal(changed, rollout), options
    _, relevance_view = app.on_rollout_controls(session, *CONTROLS)
    _, moved = app.on_rollout_controls(session, *app.Controls(start_layer=3).__dict__.values())
    assert not np.array_equal(moved, relevance_view)  # the class map shares the rollout options

    reset = app.on_reset_query(session, *CONTROLS)
    assert reset[0].query == 0 and reset[-1]["value"] == "cls"
    assert calls == []  # none of this ran the model


def test_tile_click_on_a_label_changes_nothing(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    session, *_ = app.render_query_views(session, app.Controls())
    result = app.on_tile_click(click(1, 1), session, *CONTROLS)
    assert result[0] is session


def test_ordered_grid_click_selects_the_head_shown_in_that_tile(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    controls = app.Controls(order_by="distance")
    session, *_ = app.render_query_views(session, controls)
    y, x = session.geometry.tile_origin(4, 0)
    clicked = app.on_tile_click(click(x + 1, y + 1), session, *controls.__dict__.values())[0]
    assert clicked.head == int(session.order[4, 0])


def test_export_zips_what_the_cli_writes(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    archive = app.on_export(session, *CONTROLS)
    with zipfile.ZipFile(archive) as bundle:
        names = set(bundle.namelist())
        assert {"attention.npz", "rollout.png", "heads.png"} <= names
        with bundle.open("attention.npz") as handle:
            assert np.load(handle)["attentions"].shape == (6, 4, 257, 257)


def test_bad_upload_is_a_message_not_a_crash(models, tmp_path, checkpoint):
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"GIF89a not really")
    with pytest.raises(gr.Error, match="junk.png"):
        app.run_analysis(models, str(junk), checkpoint, *CONTROLS)


def test_failed_model_switch_keeps_the_previous_model(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    corrupt = Path(checkpoint).with_name("corrupt.safetensors")
    corrupt.write_bytes(b"\x00" * 64)
    for bad in ("no-such-model", str(corrupt), "timm:not_a_model_xyz"):
        result = app.on_model_change(models, bad, checkpoint, upload, session, *CONTROLS)
        assert result[0] == checkpoint and result[1]["value"] == checkpoint and result[2] is session, bad
    after = app.on_controls(session, *CONTROLS)  # the previous model's maps still serve
    assert isinstance(after[2], np.ndarray)
    switched = app.on_model_change(models, checkpoint, checkpoint, upload, None, *CONTROLS)
    assert switched[0] == checkpoint and switched[2].analysis.model_name == "six.safetensors"


def test_model_cache_is_bounded(tmp_path):
    models = app.ModelCache(capacity=2)
    specs = [str(write_checkpoint(tmp_path / f"m{i}.safetensors", CLI_MODEL, seed=i)) for i in range(3)]
    first = models.get(specs[0])
    assert models.get(specs[0]) is first
    models.get(specs[1])
    models.get(specs[2])
    assert models.get(specs[0]) is not first  # evicted and reloaded


def test_layer_and_head_controls_select_a_head(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    session, grid, head, text = app.on_layer_head(session, 1, "h2", *CONTROLS)
    assert (session.layer, session.head) == (1, 2) and "layer 1, head h2" in text
    session, mean_grid, mean_head, text = app.on_layer_head(session, 1, app.MEAN_HEADS, *CONTROLS)
    assert session.head is None and not np.array_equal(head, mean_head) and "layer 1, mean of heads" in text
    assert not np.array_equal(grid, mean_grid)  # the outline moves from the tile to the whole row


@pytest.mark.timm
def test_app_views_handle_register_tokens_of_a_timm_model(upload):
    timm = pytest.importorskip("timm")
    from vit_explorer.models.timm_adapter import from_timm_module

    torch_model = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, depth=2, img_size=98, num_classes=3)
    models = app.ModelCache()
    models.put("timm:test-registers", from_timm_module(torch_model, "timm:test-registers"))
    outputs = app.run_analysis(models, upload, "timm:test-registers", *CONTROLS)
    session, summary = outputs[0], outputs[1]
    assert "7×7 patches of 14×14 px" in summary and "cls, reg1, reg2, reg3, reg4" in summary
    assert outputs[-1]["choices"] == ["cls", "reg1", "reg2", "reg3", "reg4", app.MEAN_PATCHES]
    register_view = app.on_query_choice(session, "reg2", *CONTROLS)
    assert register_view[0].query == 2 and "reg2" in register_view[5] and register_view[-1]["value"] == "reg2"
    height, width = app.pictures.view_hw(session.analysis)
    patch_view = app.on_patch_click(models, click(width // 2, height // 2), register_view[0], *CONTROLS)  # the middle of 7×7
    assert patch_view[0].query == session.analysis.layout.patch_token(3, 3)


def test_class_maps_tab_target_method_and_score(models, upload, checkpoint):
    session, outputs = analysed(models, upload, checkpoint)
    class_view, top_heads, plot, note = outputs[13:17]
    target_update = outputs[-2]
    top = session.analysis.top_k(1)[0]
    assert session.evidence.target == top.index and target_update["value"] == top.index
    assert target_update["choices"][0] == (f"{top.label} ({top.prob:.1%})", top.index) and len(target_update["choices"]) == 4
    assert isinstance(class_view, np.ndarray) and plot is None and top.label in note
    assert top_heads["headers"][-1] == "gradient importance (highest first)" and len(top_heads["data"]) == 5
    assert top_heads["data"][0][0] == 1 and top_heads["data"][0][-1].startswith("L")
    calls = forward_counter(models, checkpoint)

    other = (top.index + 1) % 4
    ordered = app.Controls(order_by="gradient importance")
    session2, other_view, grid, other_heads, cleared, other_note = app.on_target(models, session, other, *ordered.__dict__.values())
    assert session2.evidence.target == other and len(calls) == 1  # one forward (and backward) pass for the new class
    assert not np.array_equal(other_view, class_view) and f"thing {other}" in other_note and cleared is None
    assert other_heads != top_heads and isinstance(grid, np.ndarray)
    app.on_target(models, session2, top.index, *CONTROLS)
    assert len(calls) == 1  # the first target's evidence is kept on the analysis

    percentile = app.on_controls(session, *app.Controls(colour_scale="percentile").__dict__.values())
    assert not np.array_equal(percentile[-1], class_view) and len(calls) == 1  # recoloured from the cached maps, no pass
    grad_view, cleared, _ = app.on_method(session, *app.Controls(method="grad-rollout").__dict__.values())
    assert not np.array_equal(grad_view, class_view) and cleared is None and len(calls) == 1
    chart, text = app.on_score(models, session, *CONTROLS)
    assert chart.ndim == 3 and "deletion AUC" in text and "insertion AUC" in text and "random orders" in text
    assert len(calls) > 1  # scoring runs the perturbed images through the model
    archive = app.on_export(session, *CONTROLS)
    with zipfile.ZipFile(archive) as bundle:
        assert "relevance.png" in bundle.namelist()


@pytest.mark.hf
def test_a_backbone_shows_a_note_instead_of_class_maps(upload):
    transformers = pytest.importorskip("transformers")
    from vit_explorer.models.hf_adapter import from_hf_module

    config = transformers.Dinov2Config(image_size=56, patch_size=14, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64)
    models = app.ModelCache()
    models.put("hf:test-backbone", from_hf_module(transformers.Dinov2Model(config).eval(), "hf:test-backbone"))
    outputs = app.run_analysis(models, upload, "hf:test-backbone", *CONTROLS)
    session = outputs[0]
    assert session.evidence is None and outputs[13] is None and outputs[16] == app.NO_CLASSIFIER
    assert outputs[-2]["interactive"] is False
    rollout_view, *_ = app.on_method(session, *app.Controls(method="rollout").__dict__.values())
    assert isinstance(rollout_view, np.ndarray)  # class-agnostic maps still show
    with pytest.raises(gr.Error, match="no classifier head"):
        app.on_score(models, session, *CONTROLS)
    with pytest.raises(gr.Error, match="needs a target class"):
        app.on_controls(session, *app.Controls(order_by="gradient importance").__dict__.values())
