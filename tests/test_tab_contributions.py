"""The Head contributions tab: the decomposition, once, following a clicked head; a backbone's once it has a
target."""


import numpy as np
import pytest
from app_support import (
    CONTROLS,
    OVERVIEW,
    analysed,
    by_name,
    click,
    colour_bar_ends,
    forward_counter,
    hidden,
    is_unchanged,
    opened,
    tile_colour,
)
from PIL import Image

from vit_explorer.core.analysis import pixels_of
from vit_explorer.draw.pictures import signed
from vit_explorer.methods.ablation import kept_ablation
from vit_explorer.web.tabs import contributions as contributions_tab
from vit_explorer.web.tabs import head_ablation as ablation_tab
from vit_explorer.web.tabs import shared


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
    geometry = contributions_tab.view(session).geometry
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
    assert contributions_tab.view(session).head == other and len(calls) == 0
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
