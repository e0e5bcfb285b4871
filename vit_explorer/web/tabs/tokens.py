"""The Tokens tab: what the model outputs for each patch, the plain views DINOv2's users know. The cosine similarity of
every patch's output token to the query's (a clicked patch, or the mean patch until one is clicked), and the patch
tokens' first three principal components as red, green and blue. Both come from the upload's one pass; they are the
baselines to read any method that explains a patch target beside."""

from __future__ import annotations

import gradio as gr

from vit_explorer.core import maps
from vit_explorer.draw import pictures
from vit_explorer.web.session import Controls, Session
from vit_explorer.web.tabs.base import Tab, map_image

OUTPUTS = ("token_similarity", "token_components")


def layout() -> dict:
    with gr.Row():
        with gr.Column(min_width=300):
            gr.Markdown("**Token similarity**: cosine of each patch's output token to the query patch's (click a patch)")
            similarity = map_image("token-similarity", "Cosine similarity of output tokens to the query's")
        with gr.Column(min_width=300):
            gr.Markdown("**Principal components** of the patch tokens as red, green, blue: alike in colour, alike to the model")
            components = map_image("token-components", "First three principal components of the patch tokens")
    return {"token_similarity": similarity, "token_components": components}


def query_patch(session: Session) -> int | None:
    """The query where it is a patch; None (the mean patch) for a prefix token or the mean of patch queries."""
    query = session.query
    return query if query is not None and session.analysis.layout.token_patch(query) is not None else None


def render(session: Session, controls: Controls) -> dict:
    analysis, query = session.analysis, query_patch(session)
    reference = "the mean patch token" if query is None else maps.query_name(analysis, query)
    similarity = pictures.map_picture(analysis, maps.token_similarity(analysis, query), cmap=controls.cmap, overlay=controls.overlay,
                                      query=query, unit=f"cosine similarity of each output token to {reference}'s")
    return {"token_similarity": similarity, "token_components": pictures.components_picture(analysis, maps.token_components(analysis))}


def depends(session: Session, controls: Controls) -> tuple:
    return query_patch(session), controls.cmap, controls.overlay


TAB = Tab("Tokens", OUTPUTS, layout, render, depends)
