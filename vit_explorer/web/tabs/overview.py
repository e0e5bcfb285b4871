"""The Overview tab: attention rollout and the last layer's attention of the query (the class token until a
patch is clicked), the clicked patch outlined."""

from __future__ import annotations

import gradio as gr

from vit_explorer.core import maps
from vit_explorer.draw import pictures
from vit_explorer.web.session import Controls, Session
from vit_explorer.web.tabs.base import Tab, map_image


def layout() -> dict:
    with gr.Row():
        with gr.Column(min_width=300):
            gr.Markdown("**Attention rollout** of the query (click a patch to change it)")
            rollout = map_image("overview-rollout", "Attention rollout")
        with gr.Column(min_width=300):
            gr.Markdown("**Last layer**, mean over heads, of the query")
            last = map_image("overview-last", "Last layer, mean over heads")
    return {"overview_rollout": rollout, "overview_last": last}


def render(session: Session, controls: Controls) -> dict:
    analysis, query = session.analysis, session.query
    name = maps.query_name(analysis, query)
    rollout = maps.rollout_map(analysis, query, maps.RolloutOptions())
    last = maps.attention_map(analysis, query, analysis.map_shape[0] - 1, None)
    return {
        "overview_rollout": pictures.map_picture(analysis, rollout, cmap=controls.cmap, overlay=True, query=query,
                                                 unit=f"rollout weight of {maps.rollout_name(analysis, query)}",
                                                 scale=controls.colour_scale),
        "overview_last": pictures.map_picture(analysis, last, cmap=controls.cmap, overlay=True, query=query,
                                              unit=f"attention weight of {name}", scale=controls.colour_scale),
    }


def depends(session: Session, controls: Controls) -> tuple:
    return session.query, controls.cmap, controls.colour_scale


TAB = Tab("Overview", ("overview_rollout", "overview_last"), layout, render, depends, follows_query=True)
