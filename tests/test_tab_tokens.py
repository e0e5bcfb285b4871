"""The Tokens tab: it follows the query patch from the upload's pass."""


import numpy as np
import pytest
import torch
from app_support import (
    CONTROLS,
    analysed,
    by_name,
    click,
    forward_counter,
    is_unchanged,
    opened,
)

from vit_explorer.core import maps
from vit_explorer.web.tabs import shared
from vit_explorer.web.tabs import tokens as tokens_tab_module


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
