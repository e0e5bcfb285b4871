"""The Token norms tab: a planted outlier outlined, without running the model."""


import numpy as np
from app_support import (
    CONTROLS,
    NORMS,
    analysed,
    by_name,
    controls,
    is_unchanged,
    opened,
)

from vit_explorer.draw import charts, pictures, render
from vit_explorer.methods import norms
from vit_explorer.web.session import ModelCache
from vit_explorer.web.tabs import shared
from vit_explorer.web.tabs import token_norms as norms_tab


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
    assert "**Layer 0**: 0 flagged patches" in first["norm_layer_text"] and norms_tab.view(session).layer == 0
    assert all(is_unchanged(value) for value in opened(NORMS, session).values())  # the slider's views are on screen
    recoloured = by_name(shared.on_controls(session, NORMS, *controls(cmap="viridis")), shared.TAB_OUTPUTS)
    assert "**Layer 0**" in recoloured["norm_layer_text"] and not np.array_equal(recoloured["norm_map"], views["norm_map"])
    expected = charts.token_norm_chart(norms.for_analysis(session.analysis))
    assert np.array_equal(views["norm_chart"], expected)
