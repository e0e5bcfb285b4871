"""The app's callbacks, called directly (no server): what each event shows, that only uploads run the model, and
that only the open tab draws (the others draw when opened, once per change of what they show)."""

import zipfile
from dataclasses import replace
from pathlib import Path

import gradio as gr
import numpy as np
import pandas as pd
import pytest
from conftest import CLI_MODEL, photo, write_checkpoint

from vit_explorer import app, maps, pictures, plots
from vit_explorer.captions import MEAN_PATCHES, NO_CLASSIFIER
from vit_explorer.session import Controls, ModelCache
from vit_explorer.tabs import TABS, class_maps, export, heads, shared, statistics

OVERVIEW, GRID, ROLLOUT, CLASS_MAPS, STATISTICS, EXPORT = (tab.title for tab in TABS)


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


def controls(**changes) -> tuple:
    """Control values in ``CONTROL_NAMES`` order, as the app passes them."""
    return tuple(Controls(**changes).__dict__.values())


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


def click(x, y):
    return gr.SelectData(None, {"index": [x, y], "value": None, "selected": True})


def by_name(outputs: tuple, names: tuple) -> dict:
    assert len(outputs) == len(names)
    return dict(zip(names, outputs))


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
    top5 = outputs["top5"]
    assert len(top5) == 4 and abs(sum(top5.values()) - 1) < 1e-5
    for name in ("query_image", "overview_rollout", "overview_last"):
        picture = outputs[name]
        assert isinstance(picture, np.ndarray) and picture.ndim == 3 and picture.shape[2] == 3, name
    # the tabs nobody opened: not drawn, and cleared, so none shows an earlier image
    assert {title: len(calls) for title, calls in draws.items()} == {OVERVIEW: 1, GRID: 0, ROLLOUT: 0, CLASS_MAPS: 0, STATISTICS: 0,
                                                                      EXPORT: 0}
    for tab in TABS[1:]:
        assert all(outputs[name] is None for name in tab.outputs), tab.title


def test_opening_a_tab_draws_it_once_until_what_it_shows_changes(models, upload, checkpoint, draws):
    session, _ = analysed(models, upload, checkpoint)
    draws = draws[STATISTICS]
    views = opened(STATISTICS, session)
    assert len(draws) == 1
    analysis = session.analysis
    for name, (statistic, _) in statistics.PLOTS.items():
        plot = views[name]
        table = plot["value"]
        assert isinstance(table, pd.DataFrame) and list(table.columns) == ["layer", "head", "value"], name  # what hover shows
        values = maps.ranking_values(analysis, statistic, session.evidence)
        assert len(table) == values.size and plot["sort"] == [f"L{layer}" for layer in range(6)]
        for layer in range(6):  # every head at its layer, by hand
            for head in range(4):
                row = table[(table.layer == f"L{layer}") & (table["head"] == f"h{head}")]
                assert row["value"].item() == pytest.approx(float(values[layer, head])), (name, layer, head)
    assert "log n = 5.55" in views["entropy_plot"]["title"] and f"uniform: {1 / 257:.3g}" in views["prefix_plot"]["title"]
    assert views["top_heads"]["headers"][-1] == "gradient importance (highest first)"

    again = opened(STATISTICS, session)  # the browser already shows them: nothing is drawn or sent
    assert len(draws) == 1 and all(is_unchanged(value) for value in again.values())
    recoloured = by_name(shared.on_controls(session, STATISTICS, *controls(cmap="viridis")), shared.TAB_OUTPUTS)
    assert len(draws) == 1 and is_unchanged(recoloured["distance_plot"])  # statistics have no colours
    other = (session.target + 1) % 4
    targeted = class_maps.on_target(models, session, other, *CONTROLS)[0]
    redrawn = opened(STATISTICS, targeted)  # the gradient importance is the target's
    assert len(draws) == 2 and not redrawn["importance_plot"]["value"].equals(views["importance_plot"]["value"])


def test_statistics_plots_fit_their_axes_to_the_data():
    """No plot fixes its vertical axis: a prefix share of about 0.01 fills its plot rather than sitting on 0…1."""
    demo = app.build_demo("builtin:shapes")
    plots_by_id = {block.elem_id: block for block in demo.blocks.values() if isinstance(block, gr.ScatterPlot)}
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


def test_a_control_redraws_the_open_tab_and_the_others_when_opened(models, upload, checkpoint, draws):
    session, outputs = analysed(models, upload, checkpoint)
    overview_draws, grid_draws = draws[OVERVIEW], draws[GRID]
    viridis = controls(cmap="viridis")
    views = by_name(shared.on_controls(session, OVERVIEW, *viridis), shared.TAB_OUTPUTS)
    assert not np.array_equal(views["overview_rollout"], outputs["overview_rollout"]) and len(overview_draws) == 2
    assert is_unchanged(views["grid"]) and grid_draws == []
    assert all(is_unchanged(value) for value in by_name(shared.on_controls(session, OVERVIEW, *viridis), shared.TAB_OUTPUTS).values())
    grid = opened(GRID, session, viridis)["grid"]
    assert isinstance(grid, np.ndarray) and len(grid_draws) == 1
    assert is_unchanged(opened(OVERVIEW, session, viridis)["overview_rollout"]) and len(overview_draws) == 2
    assert isinstance(opened(OVERVIEW, session)["overview_rollout"], np.ndarray) and len(overview_draws) == 3  # back to inferno


def test_controls_patch_and_tile_clicks_rerender_without_a_forward_pass(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint, visible=GRID)
    calls = forward_counter(models, checkpoint)
    before = opened(GRID, session)  # drawn by the upload: unchanged
    assert all(is_unchanged(value) for value in before.values())
    grid_before, head_before = heads.render_grid(session, Controls()), heads.render_head(session, Controls())

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
    back = by_name(shared.on_query_choice(session, "cls", GRID, *CONTROLS), shared.QUERIED)
    assert back["state"].query == 0 and back["query"]["value"] == "cls" and back["query"]["choices"] == ["cls", MEAN_PATCHES]
    again = by_name(shared.on_query_choice(session, "patch at row 15, col 0", GRID, *CONTROLS), shared.QUERIED)
    assert again["state"].query == session.query and again["query"]["value"] == "patch at row 15, col 0"  # the query stays

    y, x = session.screen.geometry.tile_origin(2, 3)
    tile = by_name(heads.on_tile_click(click(x + 5, y + 5), session, *CONTROLS), heads.CLICKED)
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
    result = heads.on_tile_click(click(1, 1), session, *CONTROLS)
    assert result[0] is session and all(is_unchanged(value) for value in result[1:])


def test_ordered_grid_click_selects_the_head_shown_in_that_tile(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    ordered = controls(order_by="distance")
    opened(GRID, session, ordered)
    y, x = session.screen.geometry.tile_origin(4, 0)
    clicked = heads.on_tile_click(click(x + 1, y + 1), session, *ordered)[0]
    assert clicked.head == int(session.screen.order[4, 0])


def test_export_zips_what_the_cli_writes(models, upload, checkpoint):
    session, _ = analysed(models, upload, checkpoint)
    archive = export.on_export(session, *CONTROLS)
    with zipfile.ZipFile(archive) as bundle:
        names = set(bundle.namelist())
        assert {"attention.npz", "rollout.png", "heads.png"} <= names
        with bundle.open("attention.npz") as handle:
            assert np.load(handle)["attentions"].shape == (6, 4, 257, 257)


def test_bad_upload_is_a_message_not_a_crash(models, tmp_path, checkpoint):
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"GIF89a not really")
    with pytest.raises(gr.Error, match="junk.png"):
        shared.run_analysis(models, str(junk), checkpoint, OVERVIEW, *CONTROLS)


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
    selected = by_name(heads.on_layer_head(session, 1, "h2", *CONTROLS), heads.SELECTED)
    session = selected["state"]
    assert (session.layer, session.head) == (1, 2) and "layer 1, head h2" in selected["grid_caption"]
    mean = by_name(heads.on_layer_head(session, 1, heads.MEAN_HEADS, *CONTROLS), heads.SELECTED)
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
    assert isinstance(class_view, np.ndarray) and plot is None and top.label in note
    top_heads = opened(STATISTICS, session)["top_heads"]
    assert top_heads["headers"][-1] == "gradient importance (highest first)" and len(top_heads["data"]) == 5
    assert top_heads["data"][0][0] == 1 and top_heads["data"][0][-1].startswith("L")
    calls = forward_counter(models, checkpoint)

    other = (top.index + 1) % 4
    ordered = controls(order_by="gradient importance")
    targeted = by_name(class_maps.on_target(models, session, other, *ordered), class_maps.TARGETED)
    session2 = targeted["state"]
    assert session2.evidence.target == other and len(calls) == 1  # one forward (and backward) pass for the new class
    assert not np.array_equal(targeted["class_view"], class_view) and f"thing {other}" in targeted["class_text"]
    assert targeted["faithfulness_plot"] is None
    assert opened(STATISTICS, session2)["top_heads"] != top_heads and isinstance(opened(GRID, session2, ordered)["grid"], np.ndarray)
    class_maps.on_target(models, session2, top.index, *CONTROLS)
    assert len(calls) == 1  # the first target's evidence is kept on the analysis

    percentile = by_name(shared.on_controls(session, CLASS_MAPS, *controls(colour_scale="percentile")), shared.TAB_OUTPUTS)
    assert not np.array_equal(percentile["class_view"], class_view) and len(calls) == 1  # recoloured from the cached maps, no pass
    grad = by_name(shared.on_controls(session, CLASS_MAPS, *controls(method="grad-rollout")), shared.TAB_OUTPUTS)
    assert not np.array_equal(grad["class_view"], class_view) and grad["faithfulness_plot"] is None and len(calls) == 1

    chart, text = class_maps.on_score(models, session, *CONTROLS)
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
    assert cleared["faithfulness_plot"] is None and "deletion AUC" not in cleared["class_text"]
    assert opened(CLASS_MAPS, session)["faithfulness_plot"]["value"].equals(table)
    archive = export.on_export(session, *CONTROLS)
    with zipfile.ZipFile(archive) as bundle:
        assert "relevance.png" in bundle.namelist()


@pytest.mark.hf
def test_a_backbone_shows_a_note_instead_of_class_maps(upload):
    transformers = pytest.importorskip("transformers")
    from vit_explorer.models.hf_adapter import from_hf_module

    config = transformers.Dinov2Config(image_size=56, patch_size=14, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64)
    models = ModelCache()
    models.put("hf:test-backbone", from_hf_module(transformers.Dinov2Model(config).eval(), "hf:test-backbone"))
    outputs = by_name(shared.run_analysis(models, upload, "hf:test-backbone", CLASS_MAPS, *CONTROLS), shared.FULL_OUTPUTS)
    session = outputs["state"]
    assert session.evidence is None and outputs["class_view"] is None and outputs["class_text"] == NO_CLASSIFIER
    assert outputs["target"]["interactive"] is False
    rollout_view = by_name(shared.on_controls(session, CLASS_MAPS, *controls(method="rollout")), shared.TAB_OUTPUTS)["class_view"]
    assert isinstance(rollout_view, np.ndarray)  # class-agnostic maps still show
    assert opened(STATISTICS, session)["importance_plot"]["visible"] is False  # no gradient importance without a class
    with pytest.raises(gr.Error, match="no classifier head"):
        class_maps.on_score(models, session, *CONTROLS)
    with pytest.raises(gr.Error, match="needs a target class"):
        shared.on_controls(session, GRID, *controls(order_by="gradient importance"))


def test_every_tab_is_wired_by_name():
    """Each tab's outputs and controls are components of the page, and no two tabs fill the same one."""
    demo = app.build_demo("builtin:shapes")
    names = [name for tab in TABS for name in tab.outputs]
    assert len(names) == len(set(names)) and len(shared.FULL_OUTPUTS) == len(set(shared.FULL_OUTPUTS))
    ids = {block.elem_id for block in demo.blocks.values()}
    assert {f"tab-{tab.slug}" for tab in TABS} <= ids
    api = {dependency.get("api_name") for dependency in demo.config["dependencies"]}
    assert {f"open_{tab.slug}" for tab in TABS} | {"analyze", "set_colormap", "set_method", "score", "export"} <= api
