"""The Tokens tab: what the model makes of each patch, the plain views DINOv2's users know. The cosine similarity of
every patch's token to the query's (a clicked patch, or the mean patch until one is clicked), and the patch tokens'
first three principal components as red, green and blue, at the output or after any layer (through the final norm).
Both come from the upload's one pass; they are the baselines to read any method that explains a patch target beside."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import numpy as np

from vit_explorer.core import maps
from vit_explorer.draw import pictures
from vit_explorer.web.session import Controls, Session
from vit_explorer.web.tabs.base import Tab, Wiring, in_order, map_image, require, state_of, user_errors


@dataclass
class TokensView:
    """What the tokens tab keeps between events: its slider's layer (None: the last, the output tokens)."""

    layer: int | None = None


def view(session: Session) -> TokensView:
    """This tab's own view state on the session (``TokensView``)."""
    return state_of(TAB, session)


TITLE = "Tokens"
OUTPUTS = ("token_similarity", "token_components")


def layout() -> dict:
    layer = gr.Slider(0, 1, value=1, step=1, label="Tokens after layer", info="default: the last, the model's output tokens",
                      elem_id="token-layer")
    with gr.Row():
        with gr.Column(min_width=300):
            gr.Markdown("**Token similarity**: cosine of each patch's output token to the query patch's (click a patch)")
            similarity = map_image("token-similarity", "Cosine similarity of output tokens to the query's")
        with gr.Column(min_width=300):
            gr.Markdown("**Principal components** of the patch tokens as red, green, blue: alike in colour, alike to the model")
            components = map_image("token-components", "First three principal components of the patch tokens")
    return {"token_layer": layer, "token_similarity": similarity, "token_components": components}


def query_patch(session: Session) -> int | None:
    """The query where it is a patch; None (the mean patch) for a prefix token or the mean of patch queries."""
    query = session.query
    return query if query is not None and session.analysis.layout.token_patch(query) is not None else None


def shown_layer(session: Session) -> int:
    """The slider's layer, or the last (the output tokens) before it is moved."""
    last = session.analysis.map_shape[0] - 1
    return last if view(session).layer is None else view(session).layer


def render(session: Session, controls: Controls) -> dict:
    analysis, query, layer = session.analysis, query_patch(session), shown_layer(session)
    reference = "the mean patch token" if query is None else maps.query_name(analysis, query)
    tokens = "output token" if layer == analysis.map_shape[0] - 1 else f"token after layer {layer} (through the final norm)"
    unit = f"cosine similarity of each {tokens} to {reference}'s"
    similarity = pictures.map_picture(analysis, maps.token_similarity(analysis, query, layer), cmap=controls.cmap,
                                      overlay=controls.overlay, query=query, unit=unit)
    return {"token_similarity": similarity,
            "token_components": pictures.components_picture(analysis, maps.token_components(analysis, layer))}


def depends(session: Session, controls: Controls) -> tuple:
    return query_patch(session), shown_layer(session), controls.cmap, controls.overlay


def set_ranges(session: Session) -> dict:
    last = session.analysis.map_shape[0] - 1
    return {"token_layer": gr.update(maximum=last, value=last)}


@user_errors
def on_layer(session: Session | None, layer: float, *control_values) -> tuple:
    """The layer slider moved: both views at that layer's tokens, from the upload's pass."""
    session = require(session)
    view(session).layer = int(np.clip(layer, 0, session.analysis.map_shape[0] - 1))
    controls = Controls.from_values(control_values)
    session.screen.shown[TITLE] = depends(session, controls)
    return in_order(render(session, controls), OUTPUTS)


def wire(app: Wiring) -> None:
    app["token_layer"].input(on_layer, [app["state"], app["token_layer"], *app.controls], app.all(OUTPUTS),
                             api_name="set_token_layer")


TAB = Tab(TITLE, OUTPUTS, layout, render, depends, wire, ranges=("token_layer",), set_ranges=set_ranges, follows_query=True,
          state=TokensView)
