"""The Head contributions tab: what each head writes into the answer. The target's score split exactly over every head
(a layers × heads heat map, red adds to the score), MLP, the embeddings and the biases (``core.decomposition``); a
clicked head's contribution over the patches it attended to; the largest parts as bars; the logit lens across depth;
and, where the head ablation has run for the target, its heat map beside, so that heads acting directly and heads
acting through later layers can be told apart. The decomposition comes with the target's evidence, read off the same
pass (the upload's for the top class); the tab runs nothing where it did."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from vit_explorer.core.decomposition import Decomposition
from vit_explorer.draw import charts, pictures
from vit_explorer.draw.render import GridGeometry, grid_tile_px
from vit_explorer.errors import VitExplorerError
from vit_explorer.run import decompose, evidence, kept_ablation
from vit_explorer.web.captions import NO_TARGET_TO_DECOMPOSE, contributions_text, without_target
from vit_explorer.web.session import Controls, ModelCache, Session
from vit_explorer.web.tabs.base import Tab, Wiring, in_order, map_image, refresh, require, state_of, unchanged, user_errors


@dataclass
class ContributionsView:
    """What the Head contributions tab keeps between events: its heat map as drawn, for tile clicks, and the head
    clicked in it (None: the head of largest contribution)."""

    geometry: GridGeometry | None = None
    head: tuple[int, int] | None = None


def view(session: Session) -> ContributionsView:
    """This tab's own view state on the session (``ContributionsView``)."""
    return state_of(TAB, session)


OUTPUTS = ("contributions_text", "contributions_view", "contributions_split", "contributions_chart", "contributions_lens",
           "contributions_ablation_title", "contributions_ablation")
ABLATION_TITLE = ("#### Head ablation of the same heads\nHow much the target drops when each head alone is removed (zero "
                  "output): its direct and indirect effects together, on the colours above (red: the head helps the target)")
TILE_PX = 56  # as the ablation's heat map: a colour and a number per tile
ABLATION_MODE = "zero"  # the ablation shown beside: a head's output removed, the total effect of its write


def layout() -> dict:
    text = gr.Markdown("", elem_id="contributions-text")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            gr.Markdown("#### Each head's direct contribution\nto the target's score (its logit; click a head)")
            heat = map_image("contributions-view", "Direct contribution per head")
        with gr.Column(scale=2, min_width=300):
            gr.Markdown("#### The clicked head's contribution\nfrom each patch it attended to")
            split = map_image("contributions-split", "One head's contribution over the image")
    with gr.Row(equal_height=False):
        chart = map_image("contributions-chart", "The largest parts of the score")
        lens = map_image("contributions-lens", "The score read after every layer")
    ablation_title = gr.Markdown(ABLATION_TITLE, visible=False, elem_id="contributions-ablation-title")
    ablation = map_image("contributions-ablation", "Head ablation beside the direct contributions", visible=False)
    return {"contributions_text": text, "contributions_view": heat, "contributions_split": split, "contributions_chart": chart,
            "contributions_lens": lens, "contributions_ablation_title": ablation_title, "contributions_ablation": ablation}


def prepare(session: Session, controls: Controls) -> None:
    """The target's evidence came with its decomposition (the upload's and a target change's pass read it); one kept
    without it (made by another tab) is made again with it: one forward and one backward pass."""
    if session.evidence is not None and not session.evidence.decomposition_read:
        session.evidence = evidence(session.model(), session.analysis, session.evidence.target, decompose=True)


def shown(session: Session) -> Decomposition | None:
    """The target's decomposition; None without a target. Raises, with the reason, for a model that cannot be
    decomposed."""
    return None if session.evidence is None else decompose(session.evidence)


def shown_head(session: Session, decomposition: Decomposition) -> tuple[int, int]:
    """The clicked head, or the head of largest contribution before one is clicked."""
    if view(session).head is not None:
        return view(session).head
    return divmod(int(decomposition.heads.abs().argmax()), decomposition.heads.shape[1])


def nothing_shown(session: Session, text: str) -> dict:
    """The tab's outputs with no decomposition to show: ``text`` says why."""
    view(session).geometry = None
    return {"contributions_text": text,
            **{name: gr.update(value=None) for name in ("contributions_view", "contributions_split", "contributions_chart",
                                                        "contributions_lens")},
            "contributions_ablation_title": gr.update(visible=False),
            "contributions_ablation": gr.update(value=None, visible=False)}


def render(session: Session, controls: Controls) -> dict:
    try:
        decomposition = shown(session)
    except VitExplorerError as error:  # the tab says why, in place of the views; the other tabs work as ever
        return nothing_shown(session, f"**This model's score cannot be split over its parts.** {error}")
    if decomposition is None:
        return nothing_shown(session, without_target(session, NO_TARGET_TO_DECOMPOSE))
    layer, head = shown_head(session, decomposition)
    tile_px = min(TILE_PX, grid_tile_px(decomposition.heads.shape[1], pictures.GRID_PX))
    grid, view(session).geometry = pictures.contribution_picture(decomposition, selected=(layer, head),
                                                                               tile_px=tile_px)
    ablation = kept_ablation(session.analysis, session.target, ABLATION_MODE)
    beside = (gr.update(value=None, visible=False) if ablation is None
              else gr.update(value=pictures.ablation_picture(ablation, tile_px=tile_px, as_drop=True)[0], visible=True))
    title = gr.update(value=ABLATION_TITLE, visible=ablation is not None)  # an upload clears every hidden tab's outputs
    return {"contributions_text": contributions_text(decomposition, ablation, session.analysis.similarity),
            "contributions_view": grid,
            "contributions_split": pictures.head_split_picture(session.analysis, decomposition, layer, head),
            "contributions_chart": charts.contributions_chart(decomposition),
            "contributions_lens": charts.lens_chart(decomposition, session.analysis.labels),
            "contributions_ablation_title": title,
            "contributions_ablation": beside}


def depends(session: Session, controls: Controls) -> tuple:
    target = session.target
    ran = target is not None and kept_ablation(session.analysis, target, ABLATION_MODE) is not None
    return target, view(session).head, ran


@user_errors
def on_tile_click(models: ModelCache, evt: gr.SelectData, session: Session | None, *control_values) -> tuple:
    """A head clicked in the heat map: its contribution over the image, from the kept decomposition (``OUTPUTS``)."""
    session, controls = require(session), Controls.from_values(control_values)
    geometry = view(session).geometry
    hit = geometry.hit(evt.index[0], evt.index[1]) if geometry is not None else None
    if hit is None:  # a label, the colour bar, or nothing drawn yet
        return in_order(unchanged(OUTPUTS), OUTPUTS)
    view(session).head = hit
    return in_order(refresh(TAB, session, controls), OUTPUTS)


def wire(app: Wiring) -> None:
    def click(evt: gr.SelectData, session, *values):
        return on_tile_click(app.models, evt, session, *values)

    app["contributions_view"].select(click, [app["state"], *app.controls], app.all(OUTPUTS), api_name="select_contributing_head",
                                     concurrency_limit=2)


TAB = Tab("Head contributions", OUTPUTS, layout, render, depends, wire, prepare=prepare, state=ContributionsView)
