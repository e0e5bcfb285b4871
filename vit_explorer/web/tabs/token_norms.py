"""The Token norms tab: high-norm artefact tokens (Darcet et al. 2023). The norm of every token after every layer
(layers × tokens), the image with one layer's outliers outlined, per layer the norms and the attention the
outliers draw, and the prefix tokens (class token, registers) beside the patches. Drawn from the analysis's one
pass: no model runs here."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import numpy as np

from vit_explorer.core.token_norms import TokenNorms
from vit_explorer.draw import charts, pictures
from vit_explorer.run import norm_peak_layer, token_norms
from vit_explorer.web.captions import norms_layer_text, norms_text
from vit_explorer.web.session import Controls, Session
from vit_explorer.web.tabs.base import Tab, Wiring, in_order, map_image, require, state_of, user_errors


@dataclass
class NormsView:
    """What the Token norms tab keeps between events: its slider's layer (None: the layer with the most outliers)."""

    layer: int | None = None


def view(session: Session) -> NormsView:
    """This tab's own view state on the session (``NormsView``)."""
    return state_of(TAB, session)


OUTPUTS = ("norm_text", "norm_map", "norm_chart", "norm_outliers", "norm_layer_text")
LAYERED = ("norm_outliers", "norm_layer_text")  # what the layer slider redraws


def layout() -> dict:
    text = gr.Markdown("", elem_id="norm-text")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            gr.Markdown("**Every token after every layer**: its norm over the layer's median patch norm")
            norm_map = map_image("norm-map", "Token norms, layers × tokens")
            gr.Markdown("**Per layer**: patch norms against the outlier threshold, and the attention the outliers and "
                        "prefix tokens draw")
            chart = map_image("norm-chart", "Token norms and attention share per layer")
        with gr.Column(scale=2, min_width=300):
            layer = gr.Slider(0, 1, value=0, step=1, label="Layer outlined on the image",
                              info="default: the layer with the most outliers",
                              elem_id="norm-layer")
            outliers = map_image("norm-outliers", "High-norm patches of one layer")
            layer_text = gr.Markdown("", elem_id="norm-layer-text")
    return {"norm_text": text, "norm_map": norm_map, "norm_chart": chart, "norm_layer": layer, "norm_outliers": outliers,
            "norm_layer_text": layer_text}


def shown_layer(session: Session, result: TokenNorms) -> int:
    """The slider's layer, or the layer with the most outliers before it is moved."""
    return result.peak_layer if view(session).layer is None else view(session).layer


def render_layer(session: Session, controls: Controls) -> dict:
    """The image with the shown layer's outliers outlined, and what they and the prefix tokens draw (``LAYERED``)."""
    result = token_norms(session.analysis)
    layer = shown_layer(session, result)
    return {"norm_outliers": pictures.outlier_picture(session.analysis, result, layer, controls.cmap),
            "norm_layer_text": norms_layer_text(result, layer)}


def render(session: Session, controls: Controls) -> dict:
    result = token_norms(session.analysis)
    return {"norm_text": norms_text(result), "norm_map": pictures.norm_map_picture(result, controls.cmap),
            "norm_chart": charts.token_norm_chart(result), **render_layer(session, controls)}


def depends(session: Session, controls: Controls) -> tuple:
    # not the slider's layer: its own event redraws what follows it (``on_layer``), so the views stay current
    return (controls.cmap,)


def set_ranges(session: Session) -> dict:
    layers = session.analysis.map_shape[0]
    # from the norms alone: the attention each token receives is read only when the tab opens
    return {"norm_layer": gr.update(maximum=layers - 1, value=norm_peak_layer(session.analysis))}


@user_errors
def on_layer(session: Session | None, layer: float, *control_values) -> tuple:
    """The layer slider moved: that layer's outliers on the image, and their words (``LAYERED``); no model pass."""
    session = require(session)
    view(session).layer = int(np.clip(layer, 0, session.analysis.map_shape[0] - 1))
    return in_order(render_layer(session, Controls.from_values(control_values)), LAYERED)


def wire(app: Wiring) -> None:
    app["norm_layer"].input(on_layer, [app["state"], app["norm_layer"], *app.controls], app.all(LAYERED),
                            api_name="set_norm_layer")


TAB = Tab("Token norms", OUTPUTS, layout, render, depends, wire, ranges=("norm_layer",), set_ranges=set_ranges, state=NormsView)
