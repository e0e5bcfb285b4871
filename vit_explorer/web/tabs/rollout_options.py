"""The Rollout tab: attention rollout of the query, with its options (head fusion, discard ratio, start layer,
residual weight), which the rollout-based class maps share."""

from __future__ import annotations

import gradio as gr

from vit_explorer.core import maps
from vit_explorer.core.rollout import HEAD_FUSIONS
from vit_explorer.draw import pictures
from vit_explorer.web.session import Controls, Session
from vit_explorer.web.tabs.base import Tab, map_image


def layout() -> dict:
    defaults = Controls()  # the rollout defaults, as ``maps.RolloutOptions`` states them
    with gr.Row():
        head_fusion = gr.Radio(list(HEAD_FUSIONS), value=defaults.head_fusion, label="Head fusion")
        discard_ratio = gr.Slider(0.0, 0.95, value=defaults.discard_ratio, step=0.05, label="Discard ratio")
        start_layer = gr.Slider(0, 1, value=defaults.start_layer, step=1, label="Start layer")
        residual_weight = gr.Slider(0.0, 1.0, value=defaults.residual_weight, step=0.05, label="Residual weight")
    gr.Markdown("**Attention rollout of the query** (Abnar & Zuidema 2020): attention multiplied through the "
                "layers from the start layer on, with the residual weight as the skip connection's share")
    rollout_view = map_image("rollout-view", "Attention rollout of the query")
    return {"head_fusion": head_fusion, "discard_ratio": discard_ratio, "start_layer": start_layer,
            "residual_weight": residual_weight,
            "rollout_view": rollout_view}


def render(session: Session, controls: Controls) -> dict:
    grid_map = maps.rollout_map(session.analysis, session.query, controls.rollout)
    return {"rollout_view": pictures.map_picture(session.analysis, grid_map, cmap=controls.cmap, overlay=controls.overlay,
                                                 query=session.query, unit=pictures.ROLLOUT, scale=controls.colour_scale)}


def depends(session: Session, controls: Controls) -> tuple:
    return session.query, controls.rollout, controls.cmap, controls.overlay, controls.colour_scale


def set_ranges(session: Session) -> dict:
    return {"start_layer": gr.update(maximum=session.analysis.map_shape[0] - 1, value=0)}


TAB = Tab("Rollout", ("rollout_view",), layout, render, depends, ranges=("start_layer",), set_ranges=set_ranges,
          follows_query=True)
