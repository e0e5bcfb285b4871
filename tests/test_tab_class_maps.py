"""The Class maps tab: the target, the method, the faithfulness score, the scoreboard and the sanity check; a map
that waits for the model; a backbone's note."""

import zipfile

import gradio as gr
import numpy as np
import pytest
from app_support import (
    CLASS_MAPS,
    CONTROLS,
    GRID,
    STATISTICS,
    analysed,
    by_name,
    controls,
    forward_counter,
    hidden,
    is_unchanged,
    opened,
)

from vit_explorer.core import maps
from vit_explorer.draw import charts
from vit_explorer.methods.sanity import sanity_check
from vit_explorer.web.captions import NO_CLASSIFIER, SHORT_NAMES
from vit_explorer.web.session import Controls
from vit_explorer.web.tabs import class_maps, export, shared
from vit_explorer.web.tabs import head_ablation as ablation_tab


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
    curves = class_maps.view(session).score[1]
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
    board = class_maps.view(session).board[1]
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
    first, last = (by_name(step, shared.TAB_OUTPUTS) for step in shared.controls_answers(session, CLASS_MAPS, *attnlrp))
    assert first["class_view"] == gr.update(value=None)
    assert first["class_text"].startswith(f"Computing the **AttnLRP (Achtibat et al.)** map for target **thing {top}**")
    assert all(is_unchanged(value) for name, value in first.items() if name not in ("class_view", "class_text"))
    assert isinstance(last["class_view"],
                      np.ndarray) and last["class_text"].startswith("The map of **AttnLRP (Achtibat et al.)**")
    assert len(list(shared.controls_answers(session, CLASS_MAPS, *CONTROLS))) == 1  # relevance: at hand
    assert len(list(shared.controls_answers(session, CLASS_MAPS, *attnlrp))) == 1  # computed once, kept
    assert len(list(shared.controls_answers(session, GRID, *controls(method="legrad")))) == 1  # another tab: nothing waits

    other = (top + 1) % 4
    answers = shared.target_answers(models, session, other, CLASS_MAPS, *attnlrp)
    early, final = (by_name(step, shared.TARGETED) for step in answers)
    assert early["state"] is session and early["class_view"] == gr.update(value=None)
    assert f"**thing {other}**" in early["class_text"]
    assert isinstance(final["class_view"], np.ndarray) and f"**thing {other}**" in final["class_text"]
    assert len(list(shared.target_answers(models, final["state"], top, CLASS_MAPS, *attnlrp))) == 1  # seen before: at hand
    calls = forward_counter(models, checkpoint)
    (same,) = shared.target_answers(models, session, top, CLASS_MAPS, *CONTROLS)  # chosen already (a dropdown's blur)
    assert all(is_unchanged(value) for name, value in by_name(same, shared.TARGETED).items() if name != "state") and not calls
    # the second of two events for one new target, begun before the first ended: its cleared map is drawn again
    third = (top + 2) % 4
    second_event = shared.target_answers(models, session, third, CLASS_MAPS, *attnlrp)
    assert by_name(next(second_event), shared.TARGETED)["class_view"] == gr.update(value=None)
    shared.on_target(models, session, third, CLASS_MAPS, *attnlrp)  # the first event ends meanwhile
    redrawn = by_name(next(second_event), shared.TARGETED)
    assert isinstance(redrawn["class_view"], np.ndarray) and f"**thing {third}**" in redrawn["class_text"]
    assert len(calls) == 2  # the target's pass and AttnLRP's, once each
    # LeGrad chosen while another tab was open: opening the tab clears the map it would otherwise show meanwhile
    steps = list(shared.opening_answers(class_maps.TAB)(session, *controls(method="legrad")))
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
    again = list(shared.target_answers(models, session, "own", CLASS_MAPS, *controls(method="rollout")))
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


def test_sanity_check_button_shows_the_curves_under_the_map_until_the_target_changes(models, upload, tiny_checkpoint):
    checkpoint = str(tiny_checkpoint)  # 3 layers
    session, outputs = analysed(models, upload, checkpoint, visible=CLASS_MAPS)
    assert outputs["sanity_chart"]["visible"] is False and "4 forward and backward passes" in outputs["sanity_text"]
    options = controls(start_layer=1)
    checked = by_name(class_maps.on_sanity(models, session, *options), class_maps.SANITY)
    # seeded: the same check run directly gives the same curves
    expected = sanity_check(models.get(checkpoint), session.analysis, session.target, options=Controls(start_layer=1).rollout)
    assert class_maps.view(session).sanity[1].correlations == expected.correlations
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
