"""The app's callbacks, called directly (no server): what each event shows, that only uploads run the model, and
that only the open tab draws (the others draw when opened, once per change of what they show)."""

import html
import zipfile
from dataclasses import replace
from pathlib import Path

import gradio as gr
import numpy as np
import pandas as pd
import pytest
import torch
from conftest import CLI_MODEL, photo, write_checkpoint, write_stats_folder
from PIL import Image

from vit_explorer.core import maps
from vit_explorer.core.analysis import analyze, class_evidence, pixels_of
from vit_explorer.draw import charts, pictures, plots, render
from vit_explorer.draw.pictures import signed
from vit_explorer.methods import norms
from vit_explorer.methods.ablation import kept_ablation, prediction_without
from vit_explorer.methods.sanity import sanity_check
from vit_explorer.web import app
from vit_explorer.web.captions import MEAN_PATCHES, NO_CLASS_SCORE, NO_CLASSIFIER, SHORT_NAMES
from vit_explorer.web.session import Controls, ModelCache
from vit_explorer.web.tabs import TABS, class_maps, export, head_statistics, layers_heads, shared
from vit_explorer.web.tabs import compare as compare_tab
from vit_explorer.web.tabs import contributions as contributions_tab
from vit_explorer.web.tabs import head_ablation as ablation_tab
from vit_explorer.web.tabs import token_norms as norms_tab
from vit_explorer.web.tabs import tokens as tokens_tab_module

# by title, so that a tab added to ``TABS`` leaves these tests as they are
OVERVIEW, GRID, ROLLOUT, CLASS_MAPS, STATISTICS, ABLATION, NORMS, EXPORT = (
    "Overview", "Layers × heads", "Rollout", "Class maps", "Head statistics", "Head ablation", "Token norms", "Export")


@pytest.fixture
def checkpoint(tmp_path):
    return str(write_checkpoint(tmp_path / "six.safetensors", CLI_MODEL))


@pytest.fixture
def models():
    return ModelCache()


@pytest.fixture
def upload(tmp_path):
    path = tmp_path / "upload.png"
    photo((300, 200), seed=5).save(path)
    return str(path)


@pytest.fixture
def backbone_models() -> ModelCache:
    """A model cache holding ``hf:test-backbone``: a tiny random DINOv2 backbone (no classifier head)."""
    transformers = pytest.importorskip("transformers")
    from vit_explorer.models.hf_adapter import from_hf_module

    config = transformers.Dinov2Config(image_size=56, patch_size=14, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64)
    models = ModelCache()
    models.put("hf:test-backbone", from_hf_module(transformers.Dinov2Model(config).eval(), "hf:test-backbone"))
    return models


def controls(**changes) -> tuple:
    """Control values in ``CONTROL_NAMES`` order, as the app passes them."""
    return Controls.named(**changes).values()


CONTROLS = controls()


def forward_counter(models, spec):
    calls = []
    models.get(spec).module.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


@pytest.fixture
def draws(monkeypatch):
    """Counts each tab's draws by title: the app's events use tabs whose ``render`` counts (``opened`` too)."""
    calls = {tab.title: [] for tab in TABS}

    def counting(tab):
        def render(session, values):
            calls[tab.title].append(1)
            return tab.render(session, values)

        return replace(tab, render=render)

    counted = tuple(counting(tab) for tab in TABS)
    monkeypatch.setattr(shared, "TABS", counted)
    return calls


def hidden(update) -> bool:
    """A chart sent empty and hidden (no empty box on the page)."""
    return update["value"] is None and update["visible"] is False


def click(x, y):
    return gr.SelectData(None, {"index": [x, y], "value": None, "selected": True})


def by_name(outputs: tuple, names: tuple) -> dict:
    assert len(outputs) == len(names)
    return {name: read_back(value) for name, value in zip(names, outputs, strict=True)}


def read_back(value):
    """A picture an event handed to Gradio as a file (``base.as_file``), read back as the array it was drawn from."""
    if isinstance(value, str) and value.endswith(".png") and Path(value).is_file():
        return np.asarray(Image.open(value).convert("RGB"))
    if isinstance(value, dict) and isinstance(value.get("value"), str):
        return {**value, "value": read_back(value["value"])}
    return value


def test_pictures_go_to_gradio_as_lossless_files_named_by_their_content(tmp_path, monkeypatch):
    """Every picture an event returns is written once into Gradio's cache (bare or inside an update) and reads back
    exactly; the same picture is the same file; anything else passes through."""
    from vit_explorer.web.tabs import base

    monkeypatch.setattr(base, "get_upload_folder", lambda: str(tmp_path))
    rng = np.random.default_rng(0)
    picture = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
    other = picture.copy()
    other[0, 0, 0] ^= 1
    table = np.zeros((3, 3))
    rgba = np.zeros((4, 4, 4), dtype=np.uint8)
    values = {"a": picture, "b": gr.update(value=other, visible=True), "c": "text", "d": table, "e": picture.copy(), "f": rgba}
    outputs = base.in_order(values, ("a", "b", "c", "d", "e", "f"))
    assert Path(outputs[0]).parent.parent == tmp_path and outputs[4] == outputs[0] and outputs[1]["value"] != outputs[0]
    np.testing.assert_array_equal(read_back(outputs[0]), picture)
    np.testing.assert_array_equal(read_back(outputs[1])["value"], other)
    assert outputs[1]["visible"] is True and outputs[2] == "text" and outputs[3] is table and outputs[5] is rgba
    assert len(list(tmp_path.glob("*/image.png"))) == 2


def analysed(models, upload, checkpoint, visible=OVERVIEW):
    outputs = by_name(shared.run_analysis(models, upload, checkpoint, visible, *CONTROLS), shared.FULL_OUTPUTS)
    return outputs["state"], outputs


def opened(tab_title, session, values=CONTROLS) -> dict:
    """Open a tab: the outputs it sends, by name (the tabs the app's events use, see ``draws``)."""
    tab = next(tab for tab in shared.TABS if tab.title == tab_title)
    title, *outputs = shared.opener(tab)(session, *values)
    assert title == tab_title
    return by_name(tuple(outputs), tab.outputs)


def is_unchanged(value) -> bool:
    return value == gr.update()


def test_upload_fills_the_shared_views_and_the_open_tab_only(models, upload, checkpoint, draws):
    session, outputs = analysed(models, upload, checkpoint)
    assert session.analysis.attentions.shape == (6, 4, 257, 257)
    assert session.query == 0 and session.layer == 5 and session.head is None
    assert "6 layers × 4 heads" in outputs["summary"] and "16×16 patches" in outputs["summary"]
    assert outputs["top5"]["visible"] is True
    top5 = outputs["top5"]["value"]
    assert len(top5) == 4 and abs(sum(top5.values()) - 1) < 1e-5
    for name in ("query_image", "overview_rollout", "overview_last"):
        picture = outputs[name]
        assert isinstance(picture, np.ndarray) and picture.ndim == 3 and picture.shape[2] == 3, name
    # the tabs nobody opened: not drawn, and cleared, so none shows an earlier image
    assert {title: len(calls) for title, calls in draws.items()} == {**dict.fromkeys(draws, 0), OVERVIEW: 1}
    for tab in TABS[1:]:
        assert all(outputs[name] is None for name in tab.outputs), tab.title


def test_opening_a_tab_draws_it_once_until_what_it_shows_changes(models, upload, checkpoint, draws):
    session, _ = analysed(models, upload, checkpoint)
    draws = draws[STATISTICS]
    views = opened(STATISTICS, session)
    assert len(draws) == 1
    analysis = session.analysis
    for name, (statistic, _) in head_statistics.PLOTS.items():
        plot = views[name]
        table = plot["value"]
        assert isinstance(table, pd.DataFrame) and list(table.columns) == ["layer", "head", "value"], name  # what hover shows
        values = maps.ranking_values(analysis, statistic, session.evidence)
        assert len(table) == values.numel() and plot["sort"] == [f"L{layer}" for layer in range(6)]
        for layer in range(6):  # every head at its layer, by hand
            for head in range(4):
                row = table[(table.layer == f"L{layer}") & (table["head"] == f"h{head}")]
                assert row["value"].item() == pytest.approx(float(values[layer, head])), (name, layer, head)
        # whole markers at the edges: room above and below the extremes
        low, high = float(values.min()), float(values.max())
        assert plot["y_lim"][0] < low and plot["y_lim"][1] > high
        assert min(low - plot["y_lim"][0], plot["y_lim"][1] - high) >= 0.05 * (high - low), name
    assert "log n = 5.55" in views["entropy_plot"]["title"] and f"uniform: {1 / 257:.3g}" in views["prefix_plot"]["title"]
    assert views["top_heads"]["headers"][-1] == "gradient importance (highest first)"

    again = opened(STATISTICS, session)  # the browser already shows them: nothing is drawn or sent
    assert len(draws) == 1 and all(is_unchanged(value) for value in again.values())
    recoloured = by_name(shared.on_controls(session, STATISTICS, *controls(cmap="viridis")), shared.TAB_OUTPUTS)
    assert len(draws) == 1 and is_unchanged(recoloured["distance_plot"])  # statistics have no colours
    other = (session.target + 1) % 4
    targeted = by_name(shared.on_target(models, session, other, STATISTICS, *CONTROLS), shared.TARGETED)
    redrawn = targeted  # the open tab redraws at once: the gradient importance is the target's
    assert len(draws) == 2 and not redrawn["importance_plot"]["value"].equals(views["importance_plot"]["value"])
    assert all(is_unchanged(value) for value in opened(STATISTICS, targeted["state"]).values())


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


def test_upload_on_an_open_tab_draws_that_tab(models, upload, checkpoint):
    session, outputs = analysed(models, upload, checkpoint, visible=STATISTICS)
    assert isinstance(outputs["distance_plot"]["value"], pd.DataFrame) and outputs["top_heads"]["data"]
    assert outputs["overview_rollout"] is None and outputs["grid"] is None
    assert all(is_unchanged(value) for value in opened(STATISTICS, session).values())
    assert isinstance(opened(OVERVIEW, session)["overview_rollout"], np.ndarray)


def test_a_patch_clicked_on_the_overview_shows_its_own_maps_there(models, upload, checkpoint):
    session, outputs = analysed(models, upload, checkpoint)
    height, width = pictures.view_hw(session.analysis)
    clicked = by_name(shared.on_patch_click(models, click(width - 2, height - 2), session, OVERVIEW, *CONTROLS), shared.QUERIED)
    query = clicked["state"].query
    assert session.analysis.layout.token_patch(query) == (15, 15)  # the bottom-right patch of the 16×16 grid
    expected = pictures.map_picture(session.analysis, maps.rollout_map(session.analysis, query, maps.RolloutOptions()),
                                    cmap="inferno", overlay=True, query=query,
                                    unit=f"rollout weight of {maps.query_name(session.analysis, query)}")
    assert np.array_equal(clicked["overview_rollout"], expected) and not np.array_equal(expected, outputs["overview_rollout"])


def test_a_control_redraws_the_open_tab_and_the_others_when_opened(models, upload, checkpoint, draws):
    session, outputs = analysed(models, upload, checkpoint)
    overview_draws, grid_draws = draws[OVERVIEW], draws[GRID]
    viridis = controls(cmap="viridis")
    views = by_name(shared.on_controls(session, OVERVIEW, *viridis), shared.TAB_OUTPUTS)
    assert not np.array_equal(views["overview_rollout"], outputs["overview_rollout"]) and len(overview_draws) == 2
    assert is_unchanged(views["grid"]) and grid_draws == []
    assert all(is_unchanged(value)
               for value in by_name(shared.on_controls(session, OVERVIEW, *viridis), shared.TAB_OUTPUTS).values())
    grid = opened(GRID, session, viridis)["grid"]
    assert isinstance(grid, np.ndarray) and len(grid_draws) == 1
    assert is_unchanged(opened(OVERVIEW, session, viridis)["overview_rollout"]) and len(overview_draws) == 2
    assert isinstance(opened(OVERVIEW, session)["overview_rollout"], np.ndarray) and len(overview_draws) == 3  # back to inferno


def test_controls_patch_and_tile_clicks_rerender_without_a_forward_pass(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint, visible=GRID)
    calls = forward_counter(models, checkpoint)
    before = opened(GRID, session)  # drawn by the upload: unchanged
    assert all(is_unchanged(value) for value in before.values())
    grid_before, head_before = layers_heads.render_grid(session, Controls()), layers_heads.render_head(session, Controls())

    height, width = pictures.view_hw(session.analysis)
    patch = by_name(shared.on_patch_click(models, click(2, height - 2), session, GRID, *CONTROLS), shared.QUERIED)
    session = patch["state"]
    assert session.query == session.analysis.layout.patch_token(15, 0) and "patch at row 15, col 0" in patch["caption"]
    query = patch["query"]
    assert query["value"] == "patch at row 15, col 0" and query["value"] in query["choices"]  # the dropdown shows the patch
    assert "patch at row 15, col 0" in patch["grid_caption"] and "layer 5, mean of heads" in patch["grid_caption"]
    grid, head = patch["grid"], patch["head_view"]
    assert not np.array_equal(grid, grid_before) and not np.array_equal(head, head_before)
    assert is_unchanged(patch["rollout_view"])  # the rollout tab is not open: it draws when opened
    patch_query = session.query
    again = by_name(shared.on_query_choice(session, "patch at row 15, col 0", GRID, *CONTROLS), shared.QUERIED)
    assert again["state"].query == patch_query and again["query"]["value"] == "patch at row 15, col 0"  # the query stays
    back = by_name(shared.on_query_choice(session, "cls", GRID, *CONTROLS), shared.QUERIED)
    assert back["state"].query == 0 and back["query"]["value"] == "cls" and back["query"]["choices"] == ["cls", MEAN_PATCHES]
    assert back["state"] is session  # the session changes in place: one object per browser tab
    session = by_name(shared.on_patch_click(models, click(2, height - 2), session, GRID, *CONTROLS), shared.QUERIED)["state"]

    y, x = session.screen.geometry.tile_origin(2, 3)
    tile = by_name(layers_heads.on_tile_click(click(x + 5, y + 5), session, *CONTROLS), layers_heads.CLICKED)
    session = tile["state"]
    assert (session.layer, session.head) == (2, 3) and tile["layer"]["value"] == 2 and tile["head"]["value"] == "h3"
    assert "layer 2, head h3" in tile["grid_caption"]
    assert not np.array_equal(tile["grid"], grid) and not np.array_equal(tile["head_view"], head)

    recoloured = by_name(shared.on_controls(session, GRID, *controls(cmap="viridis", overlay=False, normalisation="shared",
                                                                    order_by="entropy")), shared.TAB_OUTPUTS)
    assert not np.array_equal(recoloured["grid"], tile["grid"])
    rollout = opened(ROLLOUT, session)["rollout_view"]
    for options in ({"head_fusion": "max"}, {"discard_ratio": 0.5}, {"start_layer": 3}, {"residual_weight": 0.1}):
        changed = by_name(shared.on_controls(session, ROLLOUT, *controls(**options)), shared.TAB_OUTPUTS)["rollout_view"]
        assert not np.array_equal(changed, rollout), options
    relevance_view = opened(CLASS_MAPS, session)["class_view"]
    moved = by_name(shared.on_controls(session, CLASS_MAPS, *controls(start_layer=3)), shared.TAB_OUTPUTS)["class_view"]
    assert not np.array_equal(moved, relevance_view)  # the class map shares the rollout options

    reset = by_name(shared.on_reset_query(session, GRID, *CONTROLS), shared.QUERIED)
    assert reset["state"].query == 0 and reset["query"]["value"] == "cls"
    assert calls == []  # none of this ran the model


def test_tile_click_on_a_label_changes_nothing(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint, visible=GRID)
    result = layers_heads.on_tile_click(click(1, 1), session, *CONTROLS)
    assert result[0] is session and all(is_unchanged(value) for value in result[1:])


def test_ordered_grid_click_selects_the_head_shown_in_that_tile(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    ordered = controls(order_by="distance")
    opened(GRID, session, ordered)
    y, x = session.screen.geometry.tile_origin(4, 0)
    clicked = layers_heads.on_tile_click(click(x + 1, y + 1), session, *ordered)[0]
    assert clicked.head == int(session.screen.order[4, 0])


def test_export_zips_what_the_cli_writes(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    note = opened(EXPORT, session)["export_note"]
    assert "every head's full map adds 6.0 MiB" in note  # 6 layers × 4 heads × 257² float32, said before writing
    archive = export.on_export(session, True, *CONTROLS)
    with zipfile.ZipFile(archive) as bundle:
        names = set(bundle.namelist())
        assert {"attention.npz", "rollout.png", "heads.png"} <= names
        with bundle.open("attention.npz") as handle:
            full = np.load(handle)["attentions"]
            assert full.shape == (6, 4, 257, 257)
    with zipfile.ZipFile(export.on_export(session, False, *CONTROLS)) as bundle, bundle.open("attention.npz") as handle:
        compact = np.load(handle)
        assert "attentions" not in compact  # by default the compact form only: the head means of those maps
        np.testing.assert_allclose(compact["head_mean"], full.mean(axis=1), atol=1e-3)


def test_bad_upload_is_a_message_not_a_crash(models, tmp_path, checkpoint):
    """One notice and the summary say why; no output is left in an error state (the page would stamp each with a red
    "Error" pill: the browser test counts them)."""
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"GIF89a not really")
    with pytest.warns(UserWarning, match="junk.png"):  # gr.Warning outside a request is a Python warning
        outputs = by_name(shared.run_analysis(models, str(junk), checkpoint, OVERVIEW, *CONTROLS), shared.FULL_OUTPUTS)
    assert outputs["summary"].startswith(f"⚠️ **{shared.UNREADABLE}:**") and "junk.png" in outputs["summary"]
    assert outputs["state"] is None and outputs["query_image"] is None
    # nor are the previous image's target and query left beside it
    assert outputs["target"]["choices"] == [] and outputs["target"]["value"] is None and not outputs["target"]["interactive"]
    assert outputs["query"]["choices"] == [] and outputs["query"]["value"] is None


def test_failed_model_switch_keeps_the_previous_model(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    corrupt = Path(checkpoint).with_name("corrupt.safetensors")
    corrupt.write_bytes(b"\x00" * 64)
    for bad in ("no-such-model", str(corrupt), "timm:not_a_model_xyz"):
        result = shared.on_model_change(models, bad, checkpoint, upload, session, OVERVIEW, *CONTROLS)
        assert result[0] == checkpoint and result[1]["value"] == checkpoint and result[2] is session, bad
        assert len(result) == 2 + len(shared.FULL_OUTPUTS)
    after = by_name(shared.on_controls(session, GRID, *CONTROLS), shared.TAB_OUTPUTS)  # the previous model's maps still serve
    assert isinstance(after["grid"], np.ndarray)
    switched = shared.on_model_change(models, checkpoint, checkpoint, upload, None, OVERVIEW, *CONTROLS)
    assert switched[0] == checkpoint and switched[2].analysis.model_name == "six.safetensors"


def test_model_cache_is_bounded(tmp_path):
    models = ModelCache(capacity=2)
    specs = [str(write_checkpoint(tmp_path / f"m{i}.safetensors", CLI_MODEL, seed=i)) for i in range(3)]
    first = models.get(specs[0])
    assert models.get(specs[0]) is first
    models.get(specs[1])
    models.get(specs[2])
    assert models.get(specs[0]) is not first  # evicted and reloaded


def test_layer_and_head_controls_select_a_head(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint, visible=GRID)
    selected = by_name(layers_heads.on_layer_head(session, 1, "h2", *CONTROLS), layers_heads.SELECTED)
    session = selected["state"]
    assert (session.layer, session.head) == (1, 2) and "layer 1, head h2" in selected["grid_caption"]
    mean = by_name(layers_heads.on_layer_head(session, 1, layers_heads.MEAN_HEADS, *CONTROLS), layers_heads.SELECTED)
    assert mean["state"].head is None and "layer 1, mean of heads" in mean["grid_caption"]
    assert not np.array_equal(selected["head_view"], mean["head_view"])
    assert not np.array_equal(selected["grid"], mean["grid"])  # the outline moves from the tile to the whole row


@pytest.mark.timm
def test_app_views_handle_register_tokens_of_a_timm_model(upload):
    timm = pytest.importorskip("timm")
    from vit_explorer.models.timm_adapter import from_timm_module

    torch_model = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, depth=2, img_size=98, num_classes=3)
    models = ModelCache()
    models.put("timm:test-registers", from_timm_module(torch_model, "timm:test-registers"))
    outputs = by_name(shared.run_analysis(models, upload, "timm:test-registers", OVERVIEW, *CONTROLS), shared.FULL_OUTPUTS)
    session, summary = outputs["state"], outputs["summary"]
    assert "7×7 patches of 14×14 px" in summary and "cls, reg1, reg2, reg3, reg4" in summary
    assert outputs["query"]["choices"] == ["cls", "reg1", "reg2", "reg3", "reg4", MEAN_PATCHES]
    register_view = by_name(shared.on_query_choice(session, "reg2", OVERVIEW, *CONTROLS), shared.QUERIED)
    assert register_view["state"].query == 2 and "reg2" in register_view["caption"] and register_view["query"]["value"] == "reg2"
    height, width = pictures.view_hw(session.analysis)
    patch_view = shared.on_patch_click(models, click(width // 2, height // 2), register_view["state"], OVERVIEW, *CONTROLS)
    assert patch_view[0].query == session.analysis.layout.patch_token(3, 3)  # the middle of 7×7
    share = opened(STATISTICS, session)["prefix_plot"]
    assert "cls, reg1, reg2, reg3, reg4" in share["title"] and share["value"]["value"].between(0, 1).all()


def test_class_maps_tab_target_method_and_score(models, upload, checkpoint):
    session, outputs = analysed(models, upload, checkpoint, visible=CLASS_MAPS)
    class_view, plot, note = outputs["class_view"], outputs["faithfulness_plot"], outputs["class_text"]
    target_update = outputs["target"]
    top = session.analysis.top_k(1)[0]
    assert session.evidence.target == top.index and target_update["value"] == top.index
    assert target_update["choices"][0] == (f"{top.label} ({top.prob:.1%})", top.index) and len(target_update["choices"]) == 4
    assert isinstance(class_view, np.ndarray) and hidden(plot) and top.label in note and "takes no target" not in note
    untargeted = opened(CLASS_MAPS, session, controls(method="rollout"))["class_text"]
    assert untargeted.startswith("**attention rollout** takes no target") and top.label in untargeted
    top_heads = opened(STATISTICS, session)["top_heads"]
    assert top_heads["headers"][-1] == "gradient importance (highest first)" and len(top_heads["data"]) == 5
    assert top_heads["data"][0][0] == 1 and top_heads["data"][0][-1].startswith("L")
    calls = forward_counter(models, checkpoint)

    other = (top.index + 1) % 4
    ordered = controls(order_by="gradient importance")
    targeted = by_name(shared.on_target(models, session, other, CLASS_MAPS, *ordered), shared.TARGETED)
    session2 = targeted["state"]
    assert session2.evidence.target == other and len(calls) == 1  # one forward (and backward) pass for the new class
    assert not np.array_equal(targeted["class_view"], class_view) and f"thing {other}" in targeted["class_text"]
    assert hidden(targeted["faithfulness_plot"])
    assert opened(STATISTICS, session2)["top_heads"] != top_heads
    assert isinstance(opened(GRID, session2, ordered)["grid"], np.ndarray)
    shared.on_target(models, session2, top.index, CLASS_MAPS, *CONTROLS)
    assert len(calls) == 1  # the first target's evidence is kept on the analysis

    percentile = by_name(shared.on_controls(session, CLASS_MAPS, *controls(colour_scale="percentile")), shared.TAB_OUTPUTS)
    # recoloured from the cached maps, no pass
    assert not np.array_equal(percentile["class_view"], class_view) and len(calls) == 1
    grad = by_name(shared.on_controls(session, CLASS_MAPS, *controls(method="grad-rollout")), shared.TAB_OUTPUTS)
    assert not np.array_equal(grad["class_view"], class_view) and hidden(grad["faithfulness_plot"]) and len(calls) == 1

    chart, text = class_maps.on_score(models, session, "blur", *CONTROLS)
    assert "deletion AUC" in text and "insertion AUC" in text and "random orders" in text
    assert len(calls) > 1  # scoring runs the perturbed images through the model
    curves = session.screen.score[1]
    table = chart["value"]
    assert set(table.columns) == {"share", "probability", "curve"} and len(table) == 4 * len(curves.fractions)
    deletion = table[table.curve == f"deletion (AUC {curves.aucs['deletion']:.3f})"]
    np.testing.assert_allclose(deletion["probability"], curves.deletion)
    assert set(chart["color_map"]) == set(table.curve)
    # the score stays with its map: another colour keeps it, another method clears it, and the first method brings it back
    kept = by_name(shared.on_controls(session, CLASS_MAPS, *controls(cmap="viridis")), shared.TAB_OUTPUTS)
    assert kept["faithfulness_plot"]["value"].equals(table) and "deletion AUC" in kept["class_text"]
    cleared = by_name(shared.on_controls(session, CLASS_MAPS, *controls(method="rollout")), shared.TAB_OUTPUTS)
    assert hidden(cleared["faithfulness_plot"]) and "deletion AUC" not in cleared["class_text"]
    assert opened(CLASS_MAPS, session)["faithfulness_plot"]["value"].equals(table)
    archive = export.on_export(session, False, *CONTROLS)
    with zipfile.ZipFile(archive) as bundle:
        assert "relevance.png" in bundle.namelist()

    words, table = class_maps.on_scoreboard(models, session, "mean", *CONTROLS)
    board = session.screen.board[1]
    assert "Scoreboard" in words and "mean deletion and insertion" in words and table["visible"] is True
    assert "best first. Score = insertion AUC − deletion AUC" in words
    rows = table["value"]
    assert [row[0] for row in rows] == list(range(1, len(maps.CLASS_METHODS) + 1))
    assert [row[2] for row in rows] == sorted((row[2] for row in rows), reverse=True)
    assert rows[0][1] == SHORT_NAMES[board.entries[0].method] and set(SHORT_NAMES) == set(maps.CLASS_METHODS)
    # the board stays with its target and rollout options, whatever the method shown
    assert opened(CLASS_MAPS, session, controls(method="cls"))["board_table"]["value"] == rows


def test_a_class_map_that_waits_for_the_model_is_cleared_first_and_every_caption_names_its_method(models, upload, checkpoint):
    """While AttnLRP's passes (or a new target's) run, the previous method's map is not left under the new method's
    name: the page first gets it cleared, with a line naming what is coming. A map at hand comes in one step."""
    session, outputs = analysed(models, upload, checkpoint, visible=CLASS_MAPS)
    assert outputs["class_text"].startswith("The map of **relevance (Chefer et al.)**. Target: **")
    top, attnlrp = session.target, controls(method="attnlrp")
    first, last = (by_name(step, shared.TAB_OUTPUTS) for step in shared.controls_stages(session, CLASS_MAPS, *attnlrp))
    assert first["class_view"] == gr.update(value=None)
    assert first["class_text"].startswith(f"Computing the **AttnLRP (Achtibat et al.)** map for target **thing {top}**")
    assert all(is_unchanged(value) for name, value in first.items() if name not in ("class_view", "class_text"))
    assert isinstance(last["class_view"],
                      np.ndarray) and last["class_text"].startswith("The map of **AttnLRP (Achtibat et al.)**")
    assert len(list(shared.controls_stages(session, CLASS_MAPS, *CONTROLS))) == 1  # relevance: at hand
    assert len(list(shared.controls_stages(session, CLASS_MAPS, *attnlrp))) == 1  # computed once, kept
    assert len(list(shared.controls_stages(session, GRID, *controls(method="legrad")))) == 1  # another tab: nothing waits

    other = (top + 1) % 4
    early, final = (by_name(step, shared.TARGETED) for step in shared.target_stages(models, session, other, CLASS_MAPS, *attnlrp))
    assert early["state"] is session and early["class_view"] == gr.update(value=None)
    assert f"**thing {other}**" in early["class_text"]
    assert isinstance(final["class_view"], np.ndarray) and f"**thing {other}**" in final["class_text"]
    assert len(list(shared.target_stages(models, final["state"], top, CLASS_MAPS, *attnlrp))) == 1  # seen before: at hand
    calls = forward_counter(models, checkpoint)
    (same,) = shared.target_stages(models, session, top, CLASS_MAPS, *CONTROLS)  # chosen already (a dropdown's blur)
    assert all(is_unchanged(value) for name, value in by_name(same, shared.TARGETED).items() if name != "state") and not calls
    # the second of two events for one new target, begun before the first ended: its cleared map is drawn again
    third = (top + 2) % 4
    second_event = shared.target_stages(models, session, third, CLASS_MAPS, *attnlrp)
    assert by_name(next(second_event), shared.TARGETED)["class_view"] == gr.update(value=None)
    shared.on_target(models, session, third, CLASS_MAPS, *attnlrp)  # the first event ends meanwhile
    redrawn = by_name(next(second_event), shared.TARGETED)
    assert isinstance(redrawn["class_view"], np.ndarray) and f"**thing {third}**" in redrawn["class_text"]
    assert len(calls) == 2  # the target's pass and AttnLRP's, once each
    # LeGrad chosen while another tab was open: opening the tab clears the map it would otherwise show meanwhile
    steps = list(shared.opening_stages(class_maps.TAB)(session, *controls(method="legrad")))
    assert len(steps) == 2 and steps[0][0] == steps[1][0] == CLASS_MAPS
    assert "**LeGrad (Bousselham et al.)**" in by_name(steps[0][1:], class_maps.TAB.outputs)["class_text"]


@pytest.mark.hf
def test_a_backbone_shows_a_note_instead_of_class_maps(upload, backbone_models):
    models = backbone_models
    outputs = by_name(shared.run_analysis(models, upload, "hf:test-backbone", CLASS_MAPS, *CONTROLS), shared.FULL_OUTPUTS)
    session = outputs["state"]
    assert session.evidence is None and outputs["class_text"] == NO_CLASSIFIER
    assert outputs["target"]["interactive"] is True and outputs["target"]["value"] is None
    assert [key for _, key in outputs["target"]["choices"]] == ["own", "patch"]  # similarities, no classes
    assert outputs["top5"]["visible"] is False  # no predictions: no empty box
    # the default method (relevance) needs a class: rollout shows instead, and the method control offers what exists
    rollout_view = by_name(shared.on_controls(session, CLASS_MAPS, *controls(method="rollout")), shared.TAB_OUTPUTS)["class_view"]
    assert np.array_equal(outputs["class_view"], rollout_view)
    assert outputs["method"]["value"] == "rollout" and [key for _, key in outputs["method"]["choices"]] == ["rollout", "cls"]
    assert outputs["score"]["interactive"] is False  # no faithfulness score without class probabilities
    assert outputs["scoreboard"]["interactive"] is False
    assert opened(STATISTICS, session)["importance_plot"]["visible"] is False  # no gradient importance without a class
    with pytest.raises(gr.Error, match="no classifier head"):
        class_maps.on_score(models, session, "blur", *CONTROLS)
    with pytest.raises(gr.Error, match="no classifier head"):
        class_maps.on_scoreboard(models, session, "blur", *CONTROLS)
    with pytest.raises(gr.Error, match="needs a target class"):
        shared.on_controls(session, GRID, *controls(order_by="gradient importance"))

    # a similarity target opens the class-specific maps, the head ablation and scoring (of the score, as a share)
    with pytest.raises(gr.Error, match="click a patch"):
        shared.on_target(models, session, "patch", CLASS_MAPS, *CONTROLS)  # the query is the class token
    targeted = by_name(shared.on_target(models, session, "own", CLASS_MAPS, *controls(method="attnlrp")), shared.TARGETED)
    assert session.analysis.similarity and session.target == 0 and session.target_model is not None
    assert "similarity to the image's own embedding" in targeted["class_text"] and "not a probability" in targeted["class_text"]
    assert [key for _, key in targeted["method"]["choices"]] == list(maps.CLASS_METHODS)
    assert targeted["score"]["interactive"] is True and targeted["scoreboard"]["interactive"] is True
    assert targeted["run_ablation"]["interactive"] is True  # the ablation button follows the target, not only the upload
    scored = by_name(class_maps.on_score(models, session, "blur", *controls(method="attnlrp")), class_maps.SCORED)
    assert "(curves of the share of the image's score)" in scored["class_text"]
    assert scored["faithfulness_plot"]["y_title"] == "share of the image's score"
    board = by_name(class_maps.on_scoreboard(models, session, "blur", *controls(method="attnlrp")), class_maps.BOARD)
    assert "similarity to the image's own embedding** (curves of the share of the image's score)" in board["board_text"]
    assert "over 8 steps: coarser than *Score faithfulness*'s 16" in board["board_text"]  # why its AUCs differ from the score's
    assert targeted["class_view"].shape[-1] == 3
    ran = by_name(ablation_tab.on_run(models, session, *CONTROLS), ablation_tab.OUTPUTS)
    assert "Change of the score of **similarity to the image's own embedding**" in ran["ablation_text"]
    # the dropdown sends its value again when it loses focus (a click on the method): that similarity is not computed
    # again, and no view is redrawn with the controls of that moment
    analysis, calls = session.analysis, forward_counter(models, "hf:test-backbone")
    again = list(shared.target_stages(models, session, "own", CLASS_MAPS, *controls(method="rollout")))
    assert len(again) == 1 and all(is_unchanged(value) for value in by_name(again[0], shared.TARGETED).values()
                                   if value is not session)
    assert session.analysis is analysis and not calls
    session.query = session.analysis.layout.patch_token(1, 2)
    shared.on_target(models, session, "patch", CLASS_MAPS, *CONTROLS)
    assert session.analysis.label(0) == "patch (row 1, col 2): its own output token"
    assert session.query == session.analysis.layout.patch_token(1, 2)
    patched = session.analysis
    shared.on_target(models, session, "patch", CLASS_MAPS, *CONTROLS)
    assert session.analysis is patched  # the same patch: nothing to redo
    session.query = session.analysis.layout.patch_token(2, 2)
    shared.on_target(models, session, "patch", CLASS_MAPS, *CONTROLS)
    assert session.analysis.label(0) == "patch (row 2, col 2): its own output token"  # another patch: its own similarity


def test_every_tab_is_wired_by_name():
    """Each tab's outputs and controls are components of the page, and no two tabs fill the same one."""
    demo = app.build_demo("builtin:shapes")
    names = [name for tab in TABS for name in tab.outputs]
    assert len(names) == len(set(names)) and len(shared.FULL_OUTPUTS) == len(set(shared.FULL_OUTPUTS))
    ids = {block.elem_id for block in demo.blocks.values()}
    assert {f"tab-{tab.slug}" for tab in TABS} <= ids
    api = {dependency.get("api_name") for dependency in demo.config["dependencies"]}
    assert {f"open_{tab.slug}" for tab in TABS} | {"analyze", "set_colormap", "set_method", "score", "export"} <= api
    assert {"run_ablation", "select_ablated_head", "set_ablation_mode", "set_norm_layer", "sanity_check"} <= api


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


def colour_bar_ends(picture: np.ndarray, geometry) -> tuple[np.ndarray, np.ndarray]:
    """The colours at the two ends of a heat map's colour bar (the row below the tiles with the most strongly coloured
    pixels)."""
    bar = picture[geometry.size_hw[0]:].astype(int)
    strong = np.abs(bar[..., 0] - bar[..., 2]) > 60  # clearly red or clearly blue
    row = int(strong.sum(axis=1).argmax())
    columns = np.flatnonzero(strong[row])
    return bar[row, columns[0]], bar[row, columns[-1]]


def tile_colour(picture: np.ndarray, geometry, layer: int, head: int) -> np.ndarray:
    """The colour near a heat-map tile's corner, clear of its centred value and of an outline."""
    y, x = geometry.tile_origin(layer, head)
    return picture[y + 4, x + 4].astype(int)


def test_head_ablation_runs_on_its_button_and_a_clicked_tile_shows_the_prediction_without_that_head(
        models, upload, tiny_checkpoint):
    checkpoint = str(tiny_checkpoint)  # 3 layers × 4 heads
    session, outputs = analysed(models, upload, checkpoint, visible=ABLATION)
    # 3 layers × 4 heads: 3 + (0 + 4·3) + (1 + 4·2) + (2 + 4·1) = 30 layer evaluations, 10 passes' worth
    assert outputs["run_ablation"]["value"] == "Run ablation (≈10× one forward pass)"
    assert outputs["run_ablation"]["interactive"] is True
    assert hidden(outputs["ablation_view"]) and hidden(outputs["ablation_original"])
    assert "about 10× the cost of one forward pass (1 + 3 passes" in outputs["ablation_text"]
    calls = forward_counter(models, checkpoint)

    ran = by_name(ablation_tab.on_run(models, session, *CONTROLS), ablation_tab.OUTPUTS)
    assert len(calls) == 4  # the original, then each layer's heads in one batched pass
    result = kept_ablation(session.analysis, session.target, "zero")
    delta = result.delta_probability.numpy()  # [layers, heads]
    assert ran["ablation_view"]["visible"] is True
    picture, geometry = ran["ablation_view"]["value"], session.screen.ablation_geometry
    # red where removing the head lowers the target, blue where it raises it, white for no change: the darkest tile is
    # the largest change, and each tile's hue follows its sign (a tile near 0 is near white, its hue no test)
    colours = np.array([[tile_colour(picture, geometry, layer, head) for head in range(4)] for layer in range(3)])  # [3, 4, rgb]
    darkness = -colours.sum(axis=-1)
    assert np.unravel_index(darkness.argmax(), delta.shape) == np.unravel_index(np.abs(delta).argmax(), delta.shape)
    clear = np.abs(delta) > 0.05 * np.abs(delta).max()
    assert (np.sign(colours[..., 0] - colours[..., 2]) == -np.sign(delta))[clear].all() and clear.sum() >= 6
    text = ran["ablation_text"]
    layer, head = np.unravel_index(delta.argmin(), delta.shape)
    assert text.split("Most needed: ")[1].startswith(f"**L{layer} h{head}**")
    from scipy.stats import spearmanr

    rho = spearmanr(np.abs(delta).ravel(), session.evidence.importance.ravel()).statistic
    assert f"Spearman ρ with gradient importance {rho:.2f}" in text and "Took about 10× the cost of one forward pass" in text
    original = session.analysis.top_k(5)
    assert ran["ablation_original"]["value"] == pytest.approx({p.label: p.prob for p in original})
    assert ran["ablation_without"]["value"] is None

    y, x = geometry.tile_origin(2, 1)
    clicked = by_name(ablation_tab.on_tile_click(models, click(x + geometry.tile // 2, y + geometry.tile // 2), session,
                                                 *CONTROLS),
                      ablation_tab.OUTPUTS)
    assert session.screen.ablated[1] == (2, 1) and len(calls) == 5  # one pass without that head
    without = clicked["ablation_without"]
    model = models.get(checkpoint)
    expected = prediction_without(model, pixels_of(model, session.analysis), [(2, 1)], k=5, mode="zero")
    passes = len(calls)  # the test's own pass too; none from here on
    assert without["label"] == "Top-5 without L2 h1 (zero output)"
    assert without["value"] == pytest.approx({p.label: p.prob for p in expected})
    # the batched ablation and this one pass agree on that head: the click reached head 1 of layer 2
    target = session.analysis.label(session.target)
    assert without["value"][target] == pytest.approx(result.original_probability + delta[2, 1], abs=1e-5)
    assert not np.array_equal(clicked["ablation_view"]["value"], picture)  # the clicked tile is outlined
    assert all(is_unchanged(value) for value in ablation_tab.on_tile_click(models, click(1, 1), session, *CONTROLS))

    # the other mode has not run: its note; back to zero: the map and the clicked head again, with no pass
    uniform = by_name(shared.on_controls(session, ABLATION, *controls(ablation_mode="mean")), shared.TAB_OUTPUTS)
    assert hidden(uniform["ablation_view"]) and "uniform attention" in uniform["ablation_text"]
    assert uniform["ablation_without"]["value"] is None
    assert "ablation effect" not in opened(STATISTICS, session, controls(ablation_mode="mean"))["top_heads"]["headers"][-1]
    back = by_name(shared.on_controls(session, ABLATION, *CONTROLS), shared.TAB_OUTPUTS)
    assert np.array_equal(back["ablation_view"]["value"],
                          clicked["ablation_view"]["value"]) and back["ablation_without"]["value"] == without["value"]
    assert all(is_unchanged(value) for value in opened(ABLATION, session).values())
    top_heads = opened(STATISTICS, session)["top_heads"]  # the ablation effect joins the rankings
    assert top_heads["headers"][-1].startswith("ablation effect, zero output") and f"{rho:.2f}" in top_heads["headers"][-1]
    assert top_heads["data"][0][-1] == f"L{layer} h{head} · {-delta[layer, head]:.3g}"
    assert len(calls) == passes


def test_token_norms_tab_outlines_a_planted_outlier_without_running_the_model(upload):
    from test_norms import PLANTED, loaded, planted_vit

    models = ModelCache()
    model = loaded(planted_vit(), (64, 64))  # patch (1, 1) turns high-norm at layer 1's output, of 3 layers
    models.put("planted", model)
    session, outputs = analysed(models, upload, "planted")
    # the layer with the most outliers (last on a tie)
    assert outputs["norm_layer"]["maximum"] == 2 and outputs["norm_layer"]["value"] == 2

    def refuse(*_):
        raise AssertionError("the token norms tab ran the model")

    model.module.register_forward_pre_hook(refuse)
    views = opened(NORMS, session)
    for name in ("norm_map", "norm_outliers", "norm_chart"):
        assert isinstance(views[name], np.ndarray) and views[name].ndim == 3 and views[name].shape[2] == 3, name
    text, layer_text = views["norm_text"], views["norm_layer_text"]
    assert "(k = 6) in layers 1, 2" in text and "median + k · max(1.4826 · MAD" in text
    assert "**Layer 2**: 1 flagged patch (row 1, col 1" in layer_text and "**cls**: norm" in layer_text
    # the flagged patch is outlined at layer 2, not at layer 0, where it is not yet an outlier
    x0, y0, x1, _ = pictures.patch_box(session.analysis, PLANTED, pictures.view_hw(session.analysis))
    edge = views["norm_outliers"][y0, x0:x1 + 1]
    assert (edge == render.HIGHLIGHT).all()
    first = by_name(norms_tab.on_layer(session, 0, *CONTROLS), norms_tab.LAYERED)
    assert not (first["norm_outliers"][y0, x0:x1 + 1] == render.HIGHLIGHT).all(axis=-1).all()
    assert "**Layer 0**: 0 flagged patches" in first["norm_layer_text"] and session.screen.norm_layer == 0
    assert all(is_unchanged(value) for value in opened(NORMS, session).values())  # the slider's views are on screen
    recoloured = by_name(shared.on_controls(session, NORMS, *controls(cmap="viridis")), shared.TAB_OUTPUTS)
    assert "**Layer 0**" in recoloured["norm_layer_text"] and not np.array_equal(recoloured["norm_map"], views["norm_map"])
    expected = charts.token_norm_chart(norms.for_analysis(session.analysis))
    assert np.array_equal(views["norm_chart"], expected)


def test_sanity_check_button_shows_the_curves_under_the_map_until_the_target_changes(models, upload, tiny_checkpoint):
    checkpoint = str(tiny_checkpoint)  # 3 layers
    session, outputs = analysed(models, upload, checkpoint, visible=CLASS_MAPS)
    assert outputs["sanity_chart"]["visible"] is False and "4 forward and backward passes" in outputs["sanity_text"]
    options = controls(start_layer=1)
    checked = by_name(class_maps.on_sanity(models, session, *options), class_maps.SANITY)
    # seeded: the same check run directly gives the same curves
    expected = sanity_check(models.get(checkpoint), session.analysis, session.target, options=Controls(start_layer=1).rollout)
    assert session.screen.sanity[1].correlations == expected.correlations
    assert expected.summary() in checked["sanity_text"]
    chart = checked["sanity_chart"]
    assert chart["visible"] is True and np.array_equal(chart["value"], charts.sanity_chart(expected))
    # the handler's words name the check's own figures: the correlation with every layer randomised, per method
    assert all(f"(ρ {expected.final[method]:.2f} with all 3)" in checked["sanity_text"] for method in expected.methods)

    redrawn = by_name(shared.on_controls(session, CLASS_MAPS, *controls(start_layer=1, cmap="viridis")), shared.TAB_OUTPUTS)
    assert redrawn["sanity_chart"]["visible"] is True and expected.summary() in redrawn["sanity_text"]  # kept, shown again
    other_options = by_name(shared.on_controls(session, CLASS_MAPS, *CONTROLS), shared.TAB_OUTPUTS)
    assert other_options["sanity_chart"]["visible"] is False  # the check ran for other rollout options
    other = (session.target + 1) % 5
    targeted = by_name(shared.on_target(models, session, other, CLASS_MAPS, *options), shared.TARGETED)
    assert targeted["sanity_chart"]["visible"] is False and "forward and backward passes" in targeted["sanity_text"]


@pytest.mark.hf
def test_a_backbone_has_nothing_to_ablate_but_shows_token_norms_and_a_sanity_check(upload, backbone_models):
    models = backbone_models
    session, outputs = analysed(models, upload, "hf:test-backbone", visible=ABLATION)
    assert outputs["ablation_text"] == NO_CLASS_SCORE and outputs["run_ablation"]["interactive"] is False
    with pytest.raises(gr.Error, match="no classifier head"):
        ablation_tab.on_run(models, session, *CONTROLS)
    assert isinstance(opened(NORMS, session)["norm_outliers"], np.ndarray)
    checked = by_name(class_maps.on_sanity(models, session, *CONTROLS), class_maps.SANITY)
    assert "rollout" in checked["sanity_text"] and "relevance" not in checked["sanity_text"]


COMPARE = "Compare"


def second_upload(tmp_path) -> str:
    path = tmp_path / "second.png"
    photo((200, 300), seed=9).save(path)
    return str(path)


def compared(models, session, upload, second_image=None, second_model=compare_tab.MAIN_MODEL, values=CONTROLS) -> dict:
    """A second image or model chosen in the Compare tab: the comparison and the tab's outputs, by name."""
    return by_name(compare_tab.on_compare(models, session, upload, second_image, second_model, *values), compare_tab.COMPARED)


def compare_views(session, comparison, **changes) -> dict:
    """The Compare tab's outputs after a control change while it is open."""
    outputs = by_name(shared.on_controls(session, COMPARE, *controls(comparison=comparison, **changes)), shared.TAB_OUTPUTS)
    return {name: outputs[name] for name in compare_tab.OUTPUTS}


def test_compare_a_second_image_shows_both_views_and_their_difference(models, upload, checkpoint, tmp_path):
    session, _ = analysed(models, upload, checkpoint)
    assert opened(COMPARE, session)["compare_view_a"] is None  # nothing to compare yet: the note says how
    second = second_upload(tmp_path)
    out = compared(models, session, upload, second)
    comparison, a = out["comparison"], session.analysis
    b = comparison.analysis
    assert comparison.image_name == "second.png" and not comparison.second_model
    assert "A · main image" in out["compare_title_a"] and "B · second.png" in out["compare_title_b"]
    # B is the second image through the main model, as uploading it as the main image would analyse it
    model = models.get(checkpoint)
    expected = analyze(model, second)
    np.testing.assert_array_equal(b.attentions, expected.attentions)

    options = maps.RolloutOptions()
    rollout_a, rollout_b = maps.rollout_map(a, 0, options), maps.rollout_map(b, 0, options)
    assert not np.allclose(rollout_a, rollout_b)
    # one colour scale for both sides: 0 to the larger of the two maxima
    one_scale = (0.0, max(float(rollout_a.max()), float(rollout_b.max())))
    for picture, analysis, grid_map in ((out["compare_view_a"], a, rollout_a), (out["compare_view_b"], b, rollout_b)):
        assert np.array_equal(picture,
                              pictures.map_picture(analysis, grid_map, cmap="inferno", overlay=True, query=0,
                                                   unit=pictures.ROLLOUT,
                                                            bounds=one_scale))
    assert "A and B are coloured on one scale" in out["compare_caption"]
    difference = out["compare_difference"]
    assert difference["visible"] is True
    assert np.array_equal(difference["value"], pictures.difference_picture(a, rollout_a - rollout_b, "A − B, rollout weight"))
    assert "red where A is higher" in out["compare_difference_note"]

    # the class map: B's for the main target (the same model's classes), from the evidence of that class on B's image
    views = compare_views(session, comparison, compare_view="class map")
    target = session.target
    np.testing.assert_allclose(b.evidence[target].weighted, class_evidence(model, expected, target).weighted, rtol=1e-5,
                               atol=1e-7)
    relevance_a = maps.class_map(a, "relevance", session.evidence, options)
    relevance_b = maps.class_map(b, "relevance", b.evidence[target], options)
    assert np.array_equal(views["compare_difference"]["value"],
                          pictures.difference_picture(a, relevance_a - relevance_b, "A − B, relevance (Chefer et al.)"))
    assert f"Both maps are for **{a.label(target)}**" in views["compare_caption"]
    one_scale = (0.0, max(float(relevance_a.max()), float(relevance_b.max())))  # the same rule in every view
    assert np.array_equal(views["compare_view_b"], pictures.map_picture(b, relevance_b, cmap="inferno", overlay=True, query=None,
                                                                        unit=pictures.UNITS["relevance"], bounds=one_scale))
    assert "A and B are coloured on one scale" in views["compare_caption"]

    statistics = compare_views(session, comparison, compare_statistic="entropy")
    table = statistics["compare_plot"]
    assert "**Attention entropy (nats)** of every head of A and B" in statistics["compare_plot_note"]
    for side, analysis in (("A", a), ("B", b)):
        rows = table[table.side == side]
        assert len(rows) == 6 * 4
        assert all(row.depth == pytest.approx(int(row.layer[1:]) / 5) for row in rows.itertuples())  # layer ÷ (layers − 1)
        entropy = maps.head_statistic(analysis, "entropy")
        for row in rows.itertuples():
            assert row.value == pytest.approx(float(entropy[int(row.layer[1:]), int(row.head[1:])]))


def test_compare_a_second_model_of_another_depth_aligns_layers_by_relative_depth(models, upload, checkpoint, tmp_path):
    session, _ = analysed(models, upload, checkpoint)
    three = str(write_checkpoint(tmp_path / "three.safetensors", {**CLI_MODEL, "depth": 3, "heads": 2}, seed=1))
    out = compared(models, session, upload, second_model=three)
    comparison = out["comparison"]
    b = comparison.analysis
    assert comparison.second_model and comparison.image_name is None and b.map_shape == (3, 2)
    assert "six.safetensors" in out["compare_title_a"] and "three.safetensors" in out["compare_title_b"]
    np.testing.assert_array_equal(b.image, session.analysis.image)  # the main image, through the second model

    # A's layer l sits at relative depth l/5; B's layer at that depth is 2·l/5, rounded: worked out by hand
    for layer, expected in enumerate((0, 0, 1, 1, 2, 2)):
        views = compare_views(session, comparison, compare_view="layer and head", compare_layer=layer)
        assert f"layer {layer} of 6" in views["compare_title_a"] and f"layer {expected} of 3" in views["compare_title_b"]
        assert f"A's L{layer} ↔ B's L{expected}" in views["compare_caption"] and "round(l · 2/5)" in views["compare_caption"]
        attention_b = maps.attention_map(b, 0, expected, None)
        assert np.array_equal(views["compare_view_b"], pictures.map_picture(b, attention_b, cmap="inferno", overlay=True, query=0,
                                                                            unit=pictures.ATTENTION))
        assert views["compare_difference"]["visible"] is True  # both grids are 16×16
    head = compare_views(session, comparison, compare_view="layer and head", compare_layer=5, compare_head="h3")
    assert "h3" in head["compare_title_a"] and "mean of heads" in head["compare_title_b"] and "B 2" in head["compare_caption"]
    started = compare_views(session, comparison, start_layer=4)  # the rollout's start layer is aligned too
    assert "rollout of cls from layer 4" in started["compare_title_a"] and "from layer 2" in started["compare_title_b"]

    statistics = compare_views(session, comparison)
    depths = {side: sorted(set(rows.depth)) for side, rows in statistics["compare_plot"].groupby("side")}
    assert depths == {"A": pytest.approx([0, 0.2, 0.4, 0.6, 0.8, 1]), "B": pytest.approx([0, 0.5, 1])}  # relative depths
    assert "(A: 6 layers, B: 3)" in statistics["compare_plot_note"]

    # a new main image: B showed the earlier one, and says so
    moved = tmp_path / "moved.png"
    photo((256, 256), seed=21).save(moved)
    later, _ = analysed(models, str(moved), checkpoint)
    assert "Since B was analysed, the main image" in compare_views(later, comparison)["compare_caption"]
    ended = compared(models, session, upload, None, compare_tab.MAIN_MODEL, controls(comparison=comparison))
    assert ended["comparison"] is None and ended["compare_view_b"] is None and "Upload a second image" in ended["compare_caption"]


def test_compare_grids_that_differ_give_no_difference_map_and_say_why(models, upload, checkpoint, tmp_path):
    session, _ = analysed(models, upload, checkpoint)
    small = str(write_checkpoint(tmp_path / "small.safetensors", {**CLI_MODEL, "image_size": 224, "depth": 2}))
    out = compared(models, session, upload, second_model=small)
    assert out["comparison"].analysis.grid == (14, 14)
    assert isinstance(out["compare_view_a"], np.ndarray) and isinstance(out["compare_view_b"], np.ndarray)
    difference = out["compare_difference"]
    assert difference["visible"] is False and difference["value"] is None
    note = out["compare_difference_note"]
    assert note.startswith("No difference map") and "16×16" in note and "14×14" in note


def test_compare_view_changes_redraw_without_running_a_model(models, upload, checkpoint, tmp_path):
    session, _ = analysed(models, upload, checkpoint)
    three = str(write_checkpoint(tmp_path / "three.safetensors", {**CLI_MODEL, "depth": 3}, seed=1))
    second = second_upload(tmp_path)
    comparison = compared(models, session, upload, second, three)["comparison"]

    def refuse(*_):
        raise AssertionError("a view change ran a model")

    for spec in (checkpoint, three):
        models.get(spec).module.register_forward_pre_hook(refuse)
    changes = [  # the comparison drew the default view (rollout): each of these differs from it and from each other
        {"compare_view": "class map"}, {"compare_view": "layer and head"}, {"compare_view": "layer and head", "compare_layer": 2,
                                                                               "compare_head": "h1"},
        {"cmap": "viridis"}, {"overlay": False}, {"colour_scale": "percentile"},
               {"compare_view": "class map", "method": "grad-rollout"},
        {"head_fusion": "max"}, {"start_layer": 3},
    ]
    pictures_b = []
    for change in changes:
        views = compare_views(session, comparison, **change)
        assert isinstance(views["compare_view_a"], np.ndarray) and isinstance(views["compare_view_b"], np.ndarray), change
        pictures_b.append(views["compare_view_b"].tobytes())
    assert len(set(pictures_b)) == len(changes)  # each change redrew B's view
    importance = compare_views(session, comparison, compare_statistic="gradient importance")
    assert importance["compare_plot"]["side"].nunique() == 2
    assert "**Gradient importance Σ|∇A ⊙ A|" in importance["compare_plot_note"]
    assert opened(COMPARE, session, controls(comparison=comparison))["compare_view_a"] is not None
    # Compare again with the same image and model: B is the one already analysed
    again = compared(models, session, upload, second, three, controls(comparison=comparison))
    assert again["comparison"] is not comparison and again["comparison"].analysis is comparison.analysis



def test_with_shared_normalisation_the_large_view_keeps_the_grids_scale(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    query_maps = maps.query_maps(session.analysis, session.query)  # [layers, heads, gh, gw]
    peaks = query_maps.amax(dim=(-2, -1))
    layer, head = divmod(int(peaks.argmin()), peaks.shape[1])  # the faintest head: saturated on its own scale
    session = replace(session, layer=layer, head=head)
    gray = {"cmap": "gray", "overlay": False}
    own = layers_heads.render_head(session, Controls(**gray))
    kept = layers_heads.render_head(session, Controls(**gray, normalisation="shared"))
    height, width = pictures.view_hw(session.analysis)
    assert own[:height, :width].max() >= 245  # on its own scale its maximum is (nearly: bilinear upsampling) white
    low, high = pictures.shared_bounds(query_maps)
    expected = 255 * (float(peaks[layer, head]) - low) / (high - low)  # its tile's brightest value on the grid's scale
    assert expected < 200 and expected - 20 <= int(kept[:height, :width].max()) <= expected + 1
    grid, geometry = pictures.grid_picture(session.analysis, maps.heads_view(session.analysis, session.query), shared=True,
                                           overlay=False, cmap="gray")
    assert grid.shape[0] > geometry.size_hw[0] + 2 * render.LABEL_PX  # the grid's one scale has a colour bar


def test_shape_examples_are_offered_with_the_built_in_model_only(checkpoint):
    def examples_visible(spec):
        with app.build_demo(spec, ModelCache()) as demo:
            (column,) = [block for block in demo.blocks.values() if getattr(block, "elem_id", None) == "examples"]
        return column.visible

    assert examples_visible("builtin:shapes") is True
    assert examples_visible(checkpoint) is False  # another model: the shapes would be misread, so none are offered


def test_controls_are_matched_by_name_and_the_type_says_which_run_the_model():
    from vit_explorer.web.session import CONTROL_NAMES, INPUT_NAMES, VIEW_NAMES

    chosen = Controls.named(cmap="gray", start_layer=2, fit="pad")
    assert chosen.inputs.fit == "pad" and chosen.cmap == "gray" and chosen.rollout.start_layer == 2
    assert Controls.from_values(chosen.values()) == chosen  # values in CONTROL_NAMES order, matched back by name
    assert set(INPUT_NAMES) == {"fit", "comparison", "prompts"} and not set(INPUT_NAMES) & set(VIEW_NAMES)  # what costs a pass
    assert CONTROL_NAMES == VIEW_NAMES + INPUT_NAMES
    with pytest.raises(ValueError):  # a component wired without its name: the count no longer matches
        Controls.from_values(chosen.values()[:-1])


@pytest.mark.timm
def test_a_resampled_position_embedding_is_said_in_the_app(upload, tmp_path):
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    source = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64).eval()  # a 4×4 position grid
    path = tmp_path / "small.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    models = ModelCache(input_hw=(96, 96))  # every model at 96 px, as `serve --input-size 96` runs them
    outputs = by_name(shared.run_analysis(models, upload, f"timm:vit_tiny_patch16_224@{path}", OVERVIEW, *CONTROLS),
                      shared.FULL_OUTPUTS)
    assert "Position embedding resampled by timm from the weights' 64×64 input to 96×96" in outputs["summary"]


def test_long_actions_move_a_progress_bar_to_its_end(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    layers = session.analysis.map_shape[0]
    actions = ((class_maps.on_sanity, (), layers), (ablation_tab.on_run, (), layers), (class_maps.on_score, ("blur",), None),
               (class_maps.on_scoreboard, ("blur",), None))
    for run, extra, total in actions:
        calls = []
        run(models, session, *extra, *CONTROLS, progress=lambda value, desc, unit, calls=calls: calls.append(value))
        steps = total or calls[0][1]
        assert calls[0] == (0, steps) and calls[-1] == (steps, steps) and len(calls) == steps + 1, (run.__name__, calls)


def test_gradio_hands_its_progress_bar_to_the_long_actions(checkpoint):
    from gradio.helpers import special_args

    with app.build_demo(checkpoint, ModelCache()) as demo:
        functions = {block.api_name: block.fn for block in demo.fns.values()}
    for name, index in {"sanity_check": 1, "run_ablation": 1, "score": 2, "scoreboard": 2, "compare": 4, "compare_model": 4,
                        "change_model": 5}.items():
        _, progress_index, _, _ = special_args(functions[name], inputs=[None] * 40)
        assert progress_index == index, name  # Gradio inserts its gr.Progress there, before the control values


def test_the_export_tab_writes_the_sessions_report_with_what_ran(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    before = Path(export.on_report(session, *CONTROLS)).read_text()
    assert "<h2>Faithfulness" not in before and "data:image/png;base64," in before
    class_maps.on_score(models, session, "blur", *CONTROLS)  # a score on this session's map joins the report
    after = Path(export.on_report(session, *CONTROLS)).read_text()
    assert f"<h2>Faithfulness for {session.analysis.label(session.target)}</h2>" in after, after[-3000:]
    assert "relevance (Chefer et al.)" in after and Path(checkpoint).name in after
    assert "<script" not in after


def test_a_report_never_shows_one_targets_results_under_anothers_name(models, upload, checkpoint):
    """Score, sanity check and scoreboard for the top class, then another target and its ablation: the report holds the
    ablation of the new target, and none of the old target's results, which the page no longer shows either."""
    session, _ = analysed(models, upload, checkpoint)
    first = session.target
    class_maps.on_score(models, session, "blur", *CONTROLS)
    class_maps.on_sanity(models, session, *CONTROLS)
    class_maps.on_scoreboard(models, session, "blur", *CONTROLS)
    both = Path(export.on_report(session, *CONTROLS)).read_text()
    name = html.escape(session.analysis.label(first))
    for heading in (f"<h2>Faithfulness for {name}</h2>", f"<h2>Sanity check for {name}</h2>", f"<h2>Scoreboard for {name}</h2>"):
        assert heading in both, heading
    other = next(index for index in range(session.analysis.num_classes) if index != first)
    shared.on_target(models, session, other, CLASS_MAPS, *CONTROLS)
    ablation_tab.on_run(models, session, *CONTROLS)
    report = Path(export.on_report(session, *CONTROLS)).read_text()
    assert f"<h2>Class maps for {html.escape(session.analysis.label(other))}</h2>" in report
    assert f"<h2>Head ablation for {html.escape(session.analysis.label(other))}</h2>" in report
    assert "<h2>Faithfulness" not in report and "<h2>Sanity check" not in report and "<h2>Scoreboard" not in report
    assert "percentage points" in report and "% probability" not in report


def test_the_tokens_tab_follows_the_query_patch_from_the_upload_pass(models, upload, checkpoint):
    """Cosine similarity to the clicked patch's output token and the tokens' principal components, drawn from the
    upload's pass: no model pass when the tab opens or the query moves."""
    session, _ = analysed(models, upload, checkpoint)
    forwards = forward_counter(models, checkpoint)
    tokens_tab = "Tokens"
    first = opened(tokens_tab, session)
    assert first["token_similarity"].ndim == 3 and first["token_components"].shape[2] == 3 and forwards == []
    moved = by_name(shared.on_patch_click(models, click(100, 60), session, tokens_tab, *CONTROLS), shared.QUERIED)
    assert session.analysis.layout.token_patch(session.query) is not None  # a patch is the query now
    assert not np.array_equal(moved["token_similarity"], first["token_similarity"]) and forwards == []
    np.testing.assert_array_equal(moved["token_components"], first["token_components"])  # the components do not follow a click
    # the similarity of the clicked patch to itself is the top of the scale: its tile is the colour map's brightest
    row, col = session.analysis.layout.token_patch(session.query)
    similarity = maps.token_similarity(session.analysis, session.query)
    assert float(similarity[row, col]) == pytest.approx(1.0, abs=1e-5) and float(similarity.max()) == pytest.approx(1.0, abs=1e-5)
    # the layer slider: both views at an earlier layer's tokens, still without a pass, and back at the last layer
    last = session.analysis.map_shape[0] - 1
    assert tokens_tab_module.set_ranges(session)["token_layer"]["value"] == last
    early = by_name(tokens_tab_module.on_layer(session, 0, *CONTROLS), tokens_tab_module.OUTPUTS)
    assert forwards == [] and not np.array_equal(early["token_similarity"], moved["token_similarity"])
    assert not np.array_equal(early["token_components"], first["token_components"])
    first_layer = session.analysis.layer_tokens[0].float()  # [n, dim]
    cosine = torch.nn.functional.cosine_similarity(first_layer, first_layer[session.query][None], dim=-1)
    torch.testing.assert_close(maps.token_similarity(session.analysis, session.query, 0),
                               cosine[1:].reshape(session.analysis.grid))
    assert all(is_unchanged(value) for value in opened(tokens_tab, session).values())  # drawn already, for layer 0
    back = by_name(tokens_tab_module.on_layer(session, last, *CONTROLS), tokens_tab_module.OUTPUTS)
    np.testing.assert_array_equal(back["token_similarity"], moved["token_similarity"])


@pytest.mark.hf
def test_why_two_images_match_explains_each_embedding_on_the_others_direction(upload, backbone_models, tmp_path):
    """A backbone compared on two images: *Why they match* gives A's map for the similarity of its embedding to B's and
    B's for the similarity of its embedding to A's; both scores are the same dot product over the other's length, and
    every method then draws from the two analyses without a pass."""
    models = backbone_models
    session = by_name(shared.run_analysis(models, upload, "hf:test-backbone", COMPARE, *CONTROLS), shared.FULL_OUTPUTS)["state"]
    with pytest.raises(gr.Error, match="upload a second image"):
        compare_tab.on_match(models, session, *CONTROLS)
    comparison = compared(models, session, upload, second_upload(tmp_path))["comparison"]
    matched = by_name(compare_tab.on_match(models, session, *controls(comparison=comparison, method="attnlrp")),
                      compare_tab.MATCHED)
    match = matched["comparison"].match
    assert matched["compare_view"] == "class map"
    assert match.a.label(0) == "similarity to B · second.png's embedding"
    assert match.b.label(0) == "similarity to A · the main image's embedding"
    assert "similarity to B · second.png's embedding" in matched["compare_title_a"]
    assert "Why they match" in matched["compare_caption"]
    # ⟨a, b⟩ / |b| and ⟨a, b⟩ / |a|: each times the other's own-embedding length is the same dot product
    own = {side: float(analysis.output_tokens[0].norm()) for side,
           analysis in (("a", session.analysis), ("b", comparison.analysis))}
    assert float(match.a.logits[0]) * own["b"] == pytest.approx(float(match.b.logits[0]) * own["a"], rel=1e-4)
    calls = forward_counter(models, "hf:test-backbone")
    for method in maps.CLASS_SPECIFIC:
        views = compare_views(session, matched["comparison"], compare_view="class map", method=method)
        assert isinstance(views["compare_view_a"], np.ndarray) and isinstance(views["compare_view_b"], np.ndarray)
        assert not np.array_equal(views["compare_view_a"], views["compare_view_b"])
    assert calls == []


def test_the_contributions_tab_decomposes_once_and_follows_a_clicked_head(models, upload, checkpoint):
    """Opening the tab runs no pass (the decomposition came with the upload's); the grid's tiles are each head's
    contribution; a clicked head's split is drawn from the kept result with no pass; the ablation's heat map appears
    beside once it has run."""
    session, _ = analysed(models, upload, checkpoint)
    calls = forward_counter(models, checkpoint)
    title = "Head contributions"
    first = opened(title, session)
    assert len(calls) == 0
    decomposition = session.evidence.decomposition
    assert decomposition.label == session.analysis.label(session.target)
    assert f"the parts add up to {decomposition.total:.4g}" in first["contributions_text"]
    assert hidden(first["contributions_ablation"]) and "Run the head ablation" in first["contributions_text"]
    largest = divmod(int(decomposition.heads.abs().argmax()), decomposition.heads.shape[1])
    assert first["contributions_split"].ndim == 3
    geometry = session.screen.contribution_geometry
    layers, heads_per_layer = session.analysis.map_shape
    colours = np.array([[tile_colour(first["contributions_view"], geometry, layer, head) for head in range(heads_per_layer)]
                        for layer in range(layers)])
    heads = decomposition.heads.numpy()
    clear = np.abs(heads) > 0.05 * np.abs(heads).max()
    assert (np.sign(colours[..., 0] - colours[..., 2]) == np.sign(heads))[clear].all()  # red adds to the score, blue takes
    other = (0, 0) if largest != (0, 0) else (1, 1)
    y, x = geometry.tile_origin(*other)
    clicked = by_name(contributions_tab.on_tile_click(models, click(x + geometry.tile // 2, y + geometry.tile // 2), session,
                                                      *CONTROLS),
                      contributions_tab.OUTPUTS)
    assert session.screen.contribution_head == other and len(calls) == 0
    assert not np.array_equal(clicked["contributions_split"], first["contributions_split"])
    assert all(is_unchanged(value) for value in opened(title, session).values()) and len(calls) == 0
    ablation_tab.on_run(models, session, *CONTROLS)
    with_ablation = opened(title, session)
    assert not hidden(with_ablation["contributions_ablation"]) and "A head red in both" in with_ablation["contributions_text"]
    # its heading is sent with it: an upload empties every hidden tab's outputs, the heading's text too
    title_update = with_ablation["contributions_ablation_title"]
    assert title_update["visible"] and title_update["value"].startswith("#### Head ablation of the same heads")
    # the ablation below reads as the grid above: red where the head helps the target (its removal lowers it), blue where
    # it works against it; a positive contribution above is red too, and both colour bars run from blue (negative) to red
    ablation = kept_ablation(session.analysis, session.target, "zero")
    for picture in (with_ablation["contributions_view"], with_ablation["contributions_ablation"]["value"]):
        picture = np.asarray(Image.open(picture)) if isinstance(picture, str) else picture
        left, right = colour_bar_ends(picture, geometry)
        assert left[2] > left[0] and right[0] > right[2], (left, right)
    below = with_ablation["contributions_ablation"]["value"]
    below = np.asarray(Image.open(below)) if isinstance(below, str) else below
    drop = ablation.drop.numpy()
    clear = np.abs(drop) > 0.05 * np.abs(drop).max()
    colours = np.array([[tile_colour(below, geometry, layer, head) for head in range(heads_per_layer)]
                        for layer in range(layers)])
    assert (np.sign(colours[..., 0] - colours[..., 2]) == np.sign(drop))[clear].all()
    # the score is said to be the logit, and every MLP's part is in the words, not only in the chart
    text = with_ablation["contributions_text"]
    assert "**logit**" in text and "before the softmax" in text
    assert all(f"L{layer} {signed(value, 3)}" in text for layer, value in enumerate(decomposition.mlps.tolist()))


@pytest.mark.hf
def test_a_backbone_decomposes_its_similarity_score_once_it_has_a_target(upload, backbone_models):
    """Without a target the tab says to choose one and runs nothing; with the image's own embedding as the target its
    score is decomposed, and the parts add up to the similarity score the model gives."""
    from vit_explorer.web.captions import NO_TARGET_TO_DECOMPOSE

    models = backbone_models
    session = by_name(shared.run_analysis(models, upload, "hf:test-backbone", OVERVIEW, *CONTROLS), shared.FULL_OUTPUTS)["state"]
    calls = forward_counter(models, "hf:test-backbone")
    assert opened("Head contributions", session)["contributions_text"] == NO_TARGET_TO_DECOMPOSE and calls == []
    shared.on_target(models, session, "own", OVERVIEW, *CONTROLS)
    text = opened("Head contributions", session)["contributions_text"]
    decomposition = session.evidence.decomposition
    assert "similarity to the image's own embedding" in decomposition.label and decomposition.label in text
    score = float(session.model(models).logits(pixels_of(session.model(models), session.analysis))[0, 0])
    assert decomposition.score == pytest.approx(score, abs=1e-5) and decomposition.total == pytest.approx(score, abs=1e-4)


def test_patching_b_into_a_shows_each_heads_and_tokens_effect_on_as_target(models, upload, checkpoint, tmp_path):
    """*Patch B into A*: the heads' grid is ``methods.patching``'s for the session's target, its tiles coloured by sign;
    the tokens only when asked; the views stay with the comparison until the target changes; a second model refuses."""
    from vit_explorer.methods.patching import patch

    session, _ = analysed(models, upload, checkpoint)
    with pytest.raises(gr.Error, match="upload a second image"):
        compare_tab.on_patch(models, session, False, *CONTROLS)
    comparison = compared(models, session, upload, second_upload(tmp_path))["comparison"]
    heads_only = by_name(compare_tab.on_patch(models, session, False, *controls(comparison=comparison)), compare_tab.COMPARED)
    patched = heads_only["comparison"].patched(session.analysis, session.target)
    model = models.get(checkpoint)
    expected = patch(model, pixels_of(model, session.analysis), pixels_of(model, comparison.analysis), session.target,
                     tokens=False)
    torch.testing.assert_close(patched.heads, expected.heads)
    assert patched.score_b == pytest.approx(float(model.logits(pixels_of(model, comparison.analysis))[0, session.target]),
                                            abs=1e-5)
    assert not hidden(heads_only["compare_patch_heads"]) and hidden(heads_only["compare_patch_tokens"])
    assert f"A's score {patched.score_a:.4g}, B's {patched.score_b:.4g}" in heads_only["compare_patch_text"]
    with_tokens = by_name(compare_tab.on_patch(models, session, True, *controls(comparison=comparison)), compare_tab.COMPARED)
    tokens = with_tokens["comparison"].patched(session.analysis, session.target).tokens
    assert tokens.shape == (session.analysis.map_shape[0], session.analysis.layout.num_tokens)
    assert not hidden(with_tokens["compare_patch_tokens"]) and "give B's score exactly" in with_tokens["compare_patch_text"]
    # another target: the patching was of the first, so its views go
    other = next(index for index in range(session.analysis.num_classes) if index != session.target)
    retargeted = by_name(shared.on_target(models, session, other, COMPARE, *controls(comparison=with_tokens["comparison"])),
                         shared.TARGETED)
    assert with_tokens["comparison"].patched(session.analysis, session.target) is None
    assert hidden(retargeted["compare_patch_heads"]) and retargeted["compare_patch_text"] == ""


def test_component_schemas_are_computed_once_per_data_model_and_stay_gradios():
    """The schema Gradio asks for on every updated output is computed once per data model and equals Gradio's own; a
    component that computes its own (a dropdown's choices) still does."""
    from vit_explorer.web.app import schema_once_per_data_model

    schema_once_per_data_model()
    schema_once_per_data_model()  # idempotent: not wrapped twice
    first, second = gr.Image(render=False), gr.Image(render=False, label="another")
    fresh = first.data_model.model_json_schema()
    fresh["additional_description"] = fresh.pop("description", None)
    assert first.api_info() is second.api_info() and first.api_info() == fresh
    assert gr.Dropdown(["a", "b"], render=False).api_info() != gr.Dropdown(["c"], render=False).api_info()


def test_a_dear_classifier_shows_its_forward_pass_first_then_its_evidence(models, upload, checkpoint, monkeypatch):
    """Above ``STAGED_FLOPS`` an upload answers twice: the maps of a forward pass without a graph (no target yet), then
    every view with the top class's evidence and decomposition (one forward and backward pass); below, once."""
    list(shared.analysis_stages(models, upload, checkpoint, OVERVIEW, *CONTROLS))  # the model's one pass with zero maps
    layers_seen = []
    module = models.get(checkpoint).module
    module.register_forward_pre_hook(lambda _module, _inputs: layers_seen.append(torch.is_grad_enabled()))
    once = list(shared.analysis_stages(models, upload, checkpoint, OVERVIEW, *CONTROLS))
    assert len(once) == 1 and layers_seen == [True]
    monkeypatch.setattr(shared, "STAGED_FLOPS", 0.0)
    layers_seen.clear()
    first, second = (by_name(outputs, shared.FULL_OUTPUTS) for outputs in shared.analysis_stages(models, upload, checkpoint,
                                                                                                  OVERVIEW, *CONTROLS))
    assert layers_seen == [False, True]  # a forward pass without a graph, then one with it for the evidence
    session = second["state"]
    assert session.evidence is not None and session.evidence.decomposition is not None
    assert session.evidence.target == int(session.analysis.logits.argmax())
    np.testing.assert_array_equal(first["overview_rollout"], by_name(once[0], shared.FULL_OUTPUTS)["overview_rollout"])
    assert first["target"]["interactive"] is False and second["target"]["interactive"] is True
    # the class-specific controls keep the user's method until the evidence comes; the words say it is coming
    assert first["method"] == gr.update() and "choices" in second["method"]
    pending = by_name(next(shared.analysis_stages(models, upload, checkpoint, "Class maps", *CONTROLS)), shared.FULL_OUTPUTS)
    assert "gradients are being taken" in pending["class_text"]


def test_a_query_event_carries_exactly_the_tabs_whose_views_follow_the_query(models, upload, checkpoint):
    """A tab is left out of the query's events only where a new query leaves what it shows unchanged (its ``depends``
    key), so that no view goes stale; the open tab that follows the query redraws."""
    from vit_explorer.web.tabs import TABS

    session, _ = analysed(models, upload, checkpoint)
    controls = Controls.from_values(CONTROLS)
    for tab in TABS:
        before = tab.depends(session, controls)
        session.query, kept = 7, session.query
        after = tab.depends(session, controls)
        session.query = kept
        assert (before != after) == tab.follows_query, tab.title
        assert all(name in shared.QUERIED for name in tab.outputs) == tab.follows_query, tab.title
    clicked = by_name(shared.on_patch_click(models, click(40, 40), session, "Tokens", *CONTROLS), shared.QUERIED)
    assert isinstance(clicked["token_similarity"], np.ndarray) and "overview_rollout" in clicked


def test_the_warm_up_leaves_the_first_upload_one_pass(upload, checkpoint):
    """``warm_up`` (run beside the server at start) pays the model's once-only work: after it, the first upload runs
    one forward pass, not the decomposition's extra pass with its maps at zero too."""
    from vit_explorer.web.app import warm_up

    def first_upload_passes(warmed: bool) -> int:
        fresh = ModelCache()  # a model loaded anew: nothing of it kept yet
        model = fresh.get(checkpoint)
        if warmed:
            warm_up(fresh, checkpoint)
        passes = []
        model.module.register_forward_pre_hook(lambda *_: passes.append(1))
        analysed(fresh, upload, checkpoint)
        return len(passes)

    assert first_upload_passes(warmed=False) == 2 and first_upload_passes(warmed=True) == 1


def test_the_warm_up_leaves_no_picture_behind(upload, checkpoint, tmp_path, monkeypatch):
    """Its pictures never go through a Gradio event, so Gradio would never delete them: the warm-up does."""
    from vit_explorer.web import app
    from vit_explorer.web.tabs import base

    monkeypatch.setattr(base, "get_upload_folder", lambda: str(tmp_path))
    monkeypatch.setattr(app, "get_upload_folder", lambda: str(tmp_path))
    app.warm_up(ModelCache(), checkpoint)
    assert list(tmp_path.glob("*/*.png")) == []
    analysed(ModelCache(), upload, checkpoint)  # an upload's pictures stay, for Gradio to serve
    assert len(list(tmp_path.glob("*/*.png"))) >= 2


def test_text_prompts_become_the_classes_of_a_clip_model(upload):
    """A model with a text tower: without prompts it is a backbone that says it reads text; with prompts (one per line)
    the top-5 is the zero-shot prediction over them, the target menu offers them, and every class view explains the one
    chosen, scored by the model's own image–text logit."""
    from test_clip_families import tiny_open_clip

    loaded, own_logits = tiny_open_clip()
    models = ModelCache()
    models.put("open_clip:tiny", loaded)
    plain = by_name(shared.run_analysis(models, upload, "open_clip:tiny", CLASS_MAPS, *CONTROLS), shared.FULL_OUTPUTS)
    assert "Text prompts" in plain["summary"] and plain["top5"]["visible"] is False

    prompts = ("a photo of a dog", "a red star", "two shapes")
    outputs = by_name(shared.run_analysis(models, upload, "open_clip:tiny", CLASS_MAPS,
                                          *controls(method="attnlrp", prompts="\n".join(prompts) + "\n\n")), shared.FULL_OUTPUTS)
    session = outputs["state"]
    expected = own_logits(pixels_of(loaded, session.analysis), prompts)[0].detach()
    torch.testing.assert_close(session.analysis.logits, expected, rtol=1e-4, atol=1e-4)
    top = outputs["top5"]["value"]  # {label: probability}
    assert set(top) == set(prompts)
    assert top[prompts[int(expected.argmax())]] == pytest.approx(float(expected.softmax(-1).max()), abs=1e-4)
    assert "Best-matching prompt" in outputs["summary"] and "zero-shot among the 3 prompts" in outputs["summary"]
    assert sorted(index for _, index in outputs["target"]["choices"]) == [0, 1, 2]  # each prompt, once
    assert all(shown.startswith(prompts[index]) for shown, index in outputs["target"]["choices"])
    assert session.target == int(expected.argmax())  # the best match, as the top class of a classifier
    other = (session.target + 1) % len(prompts)
    targeted = by_name(shared.on_target(models, session, other, CLASS_MAPS, *controls(method="attnlrp")), shared.TARGETED)
    assert session.evidence.target == other and prompts[other] in targeted["class_text"]
    # a second image in Compare is read with the same prompts, and explained for the same one
    second = Path(upload).with_name("second.png")
    photo((64, 64), seed=5).save(second)
    with_prompts = controls(method="attnlrp", prompts="\n".join(prompts))
    compared = by_name(compare_tab.on_compare(models, session, upload, str(second), None, *with_prompts), compare_tab.COMPARED)
    assert compared["comparison"].analysis.labels == list(prompts) and compared["comparison"].evidence.target == other
    single = by_name(shared.run_analysis(models, upload, "open_clip:tiny", OVERVIEW, *controls(prompts="a red star")),
                     shared.FULL_OUTPUTS)
    assert "one prompt, so 100% whatever the image" in single["summary"]


@pytest.mark.parametrize("family", ["open_clip", "hf-clip", "hf-siglip"])
def test_every_tab_draws_for_a_text_model_with_prompts(upload, family):
    """Every tab opens on each CLIP-like family with prompts as its classes (SigLIP has no class token; its Head
    contributions tab says why it cannot be decomposed instead of failing)."""
    from test_clip_families import FAMILIES

    loaded, _ = FAMILIES[family]()
    models = ModelCache()
    models.put(family, loaded)
    values = controls(method="legrad", prompts="a red star\na blue circle")
    outputs = by_name(shared.run_analysis(models, upload, family, OVERVIEW, *values), shared.FULL_OUTPUTS)
    session = outputs["state"]
    assert session.analysis.prompted and session.evidence is not None
    views = {tab.title: opened(tab.title, session, values) for tab in TABS}
    assert all(views.values())
    text = views["Head contributions"]["contributions_text"]
    assert ("cannot be split over its parts" in text and "read-out is not affine" in text) == (family == "hf-siglip")
