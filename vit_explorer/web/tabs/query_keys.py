"""The Queries and keys tab: one head's queries and keys in one 2-D picture (AttentionViz, Yeh et al. 2023), so that a
query lies near the keys it attends to; heads that group tokens by position, colour or object show at a glance.

The picture is an SVG drawn by ``draw.query_key_plot``: hovering a point names its token in the browser itself (no
round trip), and a click on a query makes that token the query (the plot's ``select`` event, wired by the app with the
other query events). The queries and keys come from the analysis, or from one fused forward pass where it kept its maps
whole (``prepare``); each head's projection is memoised on the analysis (``run.query_key_embedding``)."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr
import numpy as np

from vit_explorer import run
from vit_explorer.core.query_key_embedding import PROJECTIONS, JointEmbedding
from vit_explorer.draw.query_key_plot import COLOURINGS, query_key_svg
from vit_explorer.errors import VitExplorerError
from vit_explorer.web.captions import query_key_caption, query_key_sample_caption
from vit_explorer.web.session import Controls, ModelCache, Session
from vit_explorer.web.tabs.base import Tab, Wiring, in_order, refresh, require, state_of, user_errors

# a click on a query point: the SVG's points carry their token (``draw.query_key_plot``); Gradio's ``select`` event takes it
ON_CLICK = """
element.addEventListener('click', (event) => {
    const point = event.target.closest('[data-token]');
    if (point) trigger('select', {index: Number(point.dataset.token), value: point.dataset.token});
});
"""


@dataclass
class QueryKeyView:
    """What the tab keeps between events: the head shown, how it is projected and coloured, and its embedding (made by
    ``prepare`` for the rest of the view)."""

    layer: int = 0
    head: int = 0
    projection: str = "pca"
    colouring: str = "kind"
    embedding: JointEmbedding | None = None
    sample: tuple[str, str] | None = None  # the folder sample's picture and words, once asked for


def view(session: Session) -> QueryKeyView:
    """This tab's own view state on the session (``QueryKeyView``)."""
    return state_of(TAB, session)


SAMPLE = ("qk_sample_plot", "qk_sample_caption")
OUTPUTS = ("qk_plot", "qk_caption", *SAMPLE)
CHOSEN = ("state", *OUTPUTS)


def layout() -> dict:
    caption = gr.Markdown("", elem_id="qk-caption")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=320):  # gr.HTML itself takes no share of a row
            plot = gr.HTML("", elem_id="qk-plot", js_on_load=ON_CLICK, min_height=300)
        with gr.Column(scale=2, min_width=260):
            layer = gr.Slider(0, 1, value=0, step=1, label="Layer", elem_id="qk-layer")
            head = gr.Dropdown(["h0"], value="h0", label="Head", elem_id="qk-head")
            projection = gr.Radio([(label, key) for key, label in PROJECTIONS.items()], value="pca", label="Projection",
                                  elem_id="qk-projection")
            colouring = gr.Radio([(label, key) for key, label in COLOURINGS.items()], value="kind", label="Colour by",
                                 elem_id="qk-colouring")
    with gr.Accordion("A folder sample: this head's queries and keys over several images", open=False):
        with gr.Row():
            folder = gr.Textbox("", label="Folder", placeholder="/path/to/images", scale=3, elem_id="qk-folder")
            count = gr.Slider(2, 32, value=8, step=1, label="Images", scale=1, elem_id="qk-count")
        embed = gr.Button("Embed the sample's queries and keys", elem_id="qk-sample-button")
        sample_caption = gr.Markdown("", elem_id="qk-sample-caption")
        sample_plot = gr.HTML("", elem_id="qk-sample-plot", min_height=100)
    return {"qk_caption": caption, "qk_plot": plot, "qk_layer": layer, "qk_head": head, "qk_projection": projection,
            "qk_colouring": colouring, "qk_folder": folder, "qk_count": count, "qk_sample_button": embed,
            "qk_sample_plot": sample_plot, "qk_sample_caption": sample_caption}


def prepare(session: Session, controls: Controls) -> None:
    """The shown head's embedding: its queries and keys take one fused forward pass where the analysis kept its maps
    whole (once per analysis), its projection a moment (once per head)."""
    shown = view(session)
    shown.embedding = run.query_key_embedding(session.model(), session.analysis, shown.layer, shown.head, shown.projection)


def render(session: Session, controls: Controls) -> dict:
    shown, analysis = view(session), session.analysis
    query_name = analysis.layout.token_name(session.query) if session.query is not None else None
    title = f"Layer {shown.layer}, head {shown.head}: queries and keys"
    picture, words = shown.sample or ("", "")
    return {"qk_plot": query_key_svg(shown.embedding, analysis.layout, [analysis.image], shown.colouring, session.query,
                                     title),
            "qk_caption": query_key_caption(shown.embedding, shown.layer, shown.head, query_name, analysis.layout.num_tokens),
            "qk_sample_plot": picture, "qk_sample_caption": words}


def depends(session: Session, controls: Controls) -> tuple:
    shown = view(session)
    return (session.query, shown.layer, shown.head, shown.projection, shown.colouring, shown.sample)


def set_ranges(session: Session) -> dict:
    """A new analysis starts at its first layer and head (``QueryKeyView``'s defaults; its slot is made when opened)."""
    layers, heads = session.analysis.map_shape
    return {"qk_layer": gr.update(maximum=layers - 1, value=QueryKeyView.layer),
            "qk_head": gr.update(choices=[f"h{head}" for head in range(heads)], value=f"h{QueryKeyView.head}")}


@user_errors
def on_choice(session: Session | None, layer: float, head: str, projection: str, colouring: str, *control_values) -> tuple:
    """A layer, head, projection or colouring chosen: the picture and its caption follow (``CHOSEN``)."""
    session = require(session)
    layers, heads = session.analysis.map_shape
    shown = view(session)
    shown.layer = int(np.clip(layer, 0, layers - 1))
    shown.head = int(np.clip(int(str(head).removeprefix("h") or 0), 0, heads - 1))
    shown.projection, shown.colouring = projection, colouring
    return in_order({"state": session, **refresh(TAB, session, Controls.from_values(control_values))}, CHOSEN)


@user_errors
def on_sample(models: ModelCache, session: Session | None, folder: str, count: float, *control_values) -> tuple:
    """The shown head's queries and keys over a sample of the folder's images, in one picture (``SAMPLE``): one fused
    pass of the sample."""
    session = require(session)
    shown = view(session)
    if not str(folder).strip():
        raise VitExplorerError("give a folder of images (or a text file of image paths, or a glob) for the sample")
    embedding, names, images = run.query_key_sample(session.model(models), str(folder).strip(), shown.layer, shown.head,
                                                    count=int(count), projection=shown.projection)
    layout = session.analysis.layout
    title = f"Layer {shown.layer}, head {shown.head}: queries and keys of {len(names)} images"
    shown.sample = (query_key_svg(embedding, layout, images, shown.colouring, None, title, names),
                    query_key_sample_caption(embedding, shown.layer, shown.head, names, layout.num_tokens))
    return in_order({"state": session, "qk_sample_plot": shown.sample[0], "qk_sample_caption": shown.sample[1]},
                    ("state", *SAMPLE))


def wire(app: Wiring) -> None:
    chosen = [app["qk_layer"], app["qk_head"], app["qk_projection"], app["qk_colouring"]]
    for component in chosen:
        component.input(on_choice, [app["state"], *chosen, *app.controls], app.all(CHOSEN), api_name=False)

    def embed_sample(session, folder, count, *values):
        return on_sample(app.models, session, folder, count, *values)

    app["qk_sample_button"].click(embed_sample, [app["state"], app["qk_folder"], app["qk_count"], *app.controls],
                                  app.all(("state", *SAMPLE)), api_name="embed_query_key_sample", concurrency_limit=2)


TAB = Tab("Queries and keys", OUTPUTS, layout, render, depends, wire, ranges=("qk_layer", "qk_head"), set_ranges=set_ranges,
          prepare=prepare, follows_query=True, state=QueryKeyView)
