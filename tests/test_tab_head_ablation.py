"""The Head ablation tab: the ablation on its button, a clicked tile's prediction without that head, a backbone's."""


import gradio as gr
import numpy as np
import pytest
from app_support import (
    ABLATION,
    CONTROLS,
    NORMS,
    STATISTICS,
    analysed,
    by_name,
    click,
    controls,
    forward_counter,
    hidden,
    is_unchanged,
    opened,
    tile_colour,
)

from vit_explorer.core.analysis import pixels_of
from vit_explorer.methods.ablation import kept_ablation, prediction_without
from vit_explorer.web.captions import NO_CLASS_SCORE
from vit_explorer.web.tabs import class_maps, shared
from vit_explorer.web.tabs import head_ablation as ablation_tab


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
    picture, geometry = ran["ablation_view"]["value"], ablation_tab.view(session).geometry
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
    assert ablation_tab.view(session).ablated[1] == (2, 1) and len(calls) == 5  # one pass without that head
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
