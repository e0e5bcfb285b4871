"""The app's callbacks, called directly (no server): what each event shows, that only uploads run the model, and
that only the open tab draws (the others draw when opened, once per change of what they show). Each tab's own
tests are in test_tab_*.py."""

from dataclasses import replace
from pathlib import Path

import gradio as gr
import numpy as np
import pandas as pd
import pytest
import torch
from app_support import (
    CLASS_MAPS,
    CONTROLS,
    GRID,
    NORMS,
    OVERVIEW,
    ROLLOUT,
    STATISTICS,
    analysed,
    by_name,
    click,
    controls,
    forward_counter,
    is_unchanged,
    opened,
    read_back,
)
from conftest import CLI_MODEL, photo, write_checkpoint

from vit_explorer.core import maps
from vit_explorer.core.analysis import pixels_of
from vit_explorer.draw import pictures
from vit_explorer.web import app
from vit_explorer.web.captions import MEAN_PATCHES
from vit_explorer.web.session import Controls, ModelCache
from vit_explorer.web.tabs import TABS, class_maps, head_statistics, layers_heads, shared
from vit_explorer.web.tabs import compare as compare_tab
from vit_explorer.web.tabs import head_ablation as ablation_tab


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

    y, x = layers_heads.view(session).geometry.tile_origin(2, 3)
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


@pytest.mark.timm
def test_app_views_handle_register_tokens_of_a_timm_model(upload):
    timm = pytest.importorskip("timm")
    from vit_explorer.models.timm_loading import from_timm_module

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
    list(shared.analysis_answers(models, upload, checkpoint, OVERVIEW, *CONTROLS))  # the model's one pass with zero maps
    layers_seen = []
    module = models.get(checkpoint).module
    module.register_forward_pre_hook(lambda _module, _inputs: layers_seen.append(torch.is_grad_enabled()))
    once = list(shared.analysis_answers(models, upload, checkpoint, OVERVIEW, *CONTROLS))
    assert len(once) == 1 and layers_seen == [True]
    monkeypatch.setattr(shared, "STAGED_FLOPS", 0.0)
    layers_seen.clear()
    first, second = (by_name(outputs, shared.FULL_OUTPUTS) for outputs in shared.analysis_answers(models, upload, checkpoint,
                                                                                                  OVERVIEW, *CONTROLS))
    assert layers_seen == [False, True]  # a forward pass without a graph, then one with it for the evidence
    session = second["state"]
    assert session.evidence is not None and session.evidence.decomposition is not None
    assert session.evidence.target == int(session.analysis.logits.argmax())
    # the first answer's maps are derived from the fused forward's queries and keys, the once path's kept from the explicit
    # pass: equal within float32 rounding, which moves a pixel's colour by a few levels at most
    np.testing.assert_allclose(first["overview_rollout"], by_name(once[0], shared.FULL_OUTPUTS)["overview_rollout"], atol=4)
    assert first["target"]["interactive"] is False and second["target"]["interactive"] is True
    # the class-specific controls keep the user's method until the evidence comes; the words say it is coming
    assert first["method"] == gr.update() and "choices" in second["method"]
    pending = by_name(next(shared.analysis_answers(models, upload, checkpoint, "Class maps", *CONTROLS)), shared.FULL_OUTPUTS)
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
        assert (bool(tab.outputs) and all(name in shared.QUERIED for name in tab.outputs)) == tab.follows_query, tab.title
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
    assert all(views[tab.title] or not tab.outputs for tab in TABS)  # a tab without outputs draws on its own events
    text = views["Head contributions"]["contributions_text"]
    assert ("cannot be split over its parts" in text and "read-out is not affine" in text) == (family == "hf-siglip")


def test_each_tab_keeps_its_view_state_in_a_slot_of_its_own(models, upload, checkpoint):
    """A tab declares its view state (``Tab.state``) and reads it from its own slot; the session's screen holds only
    what every tab shares, so that a new tab is one module and one line in ``TABS``, and no edit of the session."""
    from dataclasses import fields

    from vit_explorer.web.session import Screen
    from vit_explorer.web.tabs import token_norms, tokens

    assert {field.name for field in fields(Screen)} == {"shown", "drawn", "tabs", "open_tab", "controls", "drawing"}
    session, _ = analysed(models, upload, checkpoint, GRID)
    assert set(session.screen.tabs) == {GRID} and layers_heads.view(session).geometry is not None
    token_norms.on_layer(session, 2, *CONTROLS)
    tokens.on_layer(session, 4, *CONTROLS)
    assert token_norms.view(session).layer == 2 and tokens.view(session).layer == 4  # two sliders, two slots
    assert set(session.screen.tabs) == {GRID, NORMS, tokens.TITLE}
    fresh, _ = analysed(models, upload, checkpoint, GRID)  # a new analysis: every tab starts afresh
    assert token_norms.view(fresh).layer is None and tokens.view(fresh).layer is None
