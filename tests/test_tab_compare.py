"""The Compare tab: a second image or model beside the first, their difference, why two images match, and patching."""


import gradio as gr
import numpy as np
import pytest
import torch
from app_support import (
    CONTROLS,
    analysed,
    by_name,
    controls,
    forward_counter,
    hidden,
    opened,
)
from conftest import CLI_MODEL, photo, write_checkpoint

from vit_explorer.core import maps
from vit_explorer.core.analysis import analyze, class_evidence, pixels_of
from vit_explorer.draw import pictures
from vit_explorer.web.tabs import compare as compare_tab
from vit_explorer.web.tabs import shared

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
