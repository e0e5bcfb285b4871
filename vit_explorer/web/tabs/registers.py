"""The Test-time register tab (Jiang et al. 2025): the image through the model without and with a test-time register,
side by side: the class token's last-layer attention, every token's norm after every layer, and on request every
method's scoreboard; the words say what the register file chose and how much the edit moved the logits.

The register comes from ``serve --registers FILE`` (``ModelCache.registers``); the model with it is made once and kept
with the other models, and its analysis of the image once per analysis (``run.with_register``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr

from vit_explorer import run
from vit_explorer.core import maps
from vit_explorer.core.analysis import Analysis
from vit_explorer.core.curves import Protocol
from vit_explorer.core.ranking import Scoreboard
from vit_explorer.draw import pictures
from vit_explorer.errors import VitExplorerError
from vit_explorer.models import LoadedModel
from vit_explorer.web.captions import NO_REGISTERS, board_rows, board_text, register_text
from vit_explorer.web.session import Controls, ModelCache, Session
from vit_explorer.web.tabs.base import Tab, Wiring, in_order, map_image, require, run_progress, state_of, user_errors
from vit_explorer.web.tabs.class_maps import BOARD_COLUMNS

SIDES = ("without", "with")


@dataclass
class RegisterView:
    """What the tab keeps between events: the image's analysis with the register (made by ``prepare``), and the
    scoreboards of both sides once asked for."""

    analysis: Analysis | None = None
    boards: tuple[Scoreboard, Scoreboard] | None = None


def view(session: Session) -> RegisterView:
    """This tab's own view state on the session (``RegisterView``)."""
    return state_of(TAB, session)


PICTURES = tuple(f"register_{kind}_{side}" for kind in ("map", "norms") for side in SIDES)
BOARDS = ("register_board_text", *(f"register_table_{side}" for side in SIDES))
OUTPUTS = ("register_text", *PICTURES, *BOARDS)


def layout() -> dict:
    components = {"register_text": gr.Markdown(NO_REGISTERS, elem_id="register-text")}
    with gr.Row(equal_height=False):
        for side in SIDES:
            with gr.Column(min_width=300):
                gr.Markdown(f"**{'Without the register' if side == 'without' else 'With the test-time register'}**")
                components[f"register_map_{side}"] = map_image(f"register-map-{side}", f"Class token's attention, {side}")
                components[f"register_norms_{side}"] = map_image(f"register-norms-{side}", f"Token norms, {side}")
    components["register_score"] = gr.Button("Score every method, without and with the register", elem_id="register-score")
    components["register_board_text"] = gr.Markdown("", elem_id="register-board-text")
    with gr.Row(equal_height=False):
        for side in SIDES:
            components[f"register_table_{side}"] = gr.Dataframe(headers=BOARD_COLUMNS, interactive=False, visible=False,
                                                                elem_id=f"register-table-{side}", show_label=False)
    return components


def registered_model(session: Session) -> LoadedModel | None:
    """The session's model (as loaded: a backbone's similarity target is not carried over) with the register, or None (no
    file, another model's, or one that changes nothing)."""
    return session.models.with_register(session.models.get(session.model_spec))


def prepare(session: Session, controls: Controls) -> None:
    """The image through the model with the register: one analysis, kept on the session's analysis."""
    model = registered_model(session)
    view(session).analysis = run.with_register(model, session.analysis) if model is not None else None


def side_pictures(analysis: Analysis, side: str, controls: Controls) -> dict:
    query = maps.default_query(analysis)
    last = analysis.map_shape[0] - 1
    shown = maps.attention_map(analysis, query, last, None)
    return {f"register_map_{side}": pictures.map_picture(analysis, shown, cmap=controls.cmap, overlay=controls.overlay,
                                                         query=query, unit=pictures.ATTENTION, scale=controls.colour_scale),
            f"register_norms_{side}": pictures.norm_map_picture(run.token_norms(analysis), controls.cmap)}


def board_views(session: Session) -> dict:
    boards = view(session).boards
    if boards is None:
        return {"register_board_text": "", **{f"register_table_{side}": gr.update(value=None, visible=False) for side in SIDES}}
    words = [f"**{side.capitalize()} the register**: {board_text(analysis, board)}"
             for side, analysis, board in zip(SIDES, (session.analysis, view(session).analysis), boards, strict=True)]
    return {"register_board_text": "\n\n".join(words),
            **{f"register_table_{side}": gr.update(value=board_rows(board), headers=BOARD_COLUMNS, visible=True)
               for side, board in zip(SIDES, boards, strict=True)}}


def render(session: Session, controls: Controls) -> dict:
    neurons, with_register = session.models.registers, view(session).analysis
    empty = dict.fromkeys(PICTURES)
    if neurons is None:
        return {"register_text": NO_REGISTERS, **empty, **board_views(session)}
    if with_register is None:
        return {"register_text": register_text(neurons, session.analysis, None, None), **empty, **board_views(session)}
    norms = (run.token_norms(session.analysis), run.token_norms(with_register))
    return {"register_text": register_text(neurons, session.analysis, with_register, norms),
            **side_pictures(session.analysis, "without", controls), **side_pictures(with_register, "with", controls),
            **board_views(session)}


def depends(session: Session, controls: Controls) -> tuple:
    boards = view(session).boards
    return (controls.cmap, controls.overlay, controls.colour_scale, id(boards))


@user_errors
def on_score(models: ModelCache, session: Session | None, *control_values, progress: Callable | None = None) -> tuple:
    """Every method scored and ranked for the top class, without and with the register (``BOARDS``)."""
    session, controls = require(session), Controls.from_values(control_values)
    model, shown = registered_model(session), view(session)
    if model is None or shown.analysis is None or not session.analysis.num_classes:
        raise VitExplorerError("the scoreboard needs a classifier and a registers file for it (serve --registers FILE)")
    stage = run_progress(progress)
    target = session.analysis.top_k(1)[0].index  # one class for both sides: the model's answer without the register
    boards = []
    for side_model, analysis in ((models.get(session.model_spec), session.analysis), (model, shown.analysis)):
        evidence = run.evidence(side_model, analysis, target)
        boards.append(run.rank(side_model, analysis, evidence, Protocol("blur"), options=controls.rollout, progress=stage))
    shown.boards = (boards[0], boards[1])
    return in_order(board_views(session), BOARDS)


def wire(app: Wiring) -> None:
    def score_both(session, progress=gr.Progress(), *values):  # Gradio passes its bar to a parameter with a default
        return on_score(app.models, session, *values, progress=progress)

    app["register_score"].click(score_both, [app["state"], *app.controls], app.all(BOARDS), api_name="score_register",
                                concurrency_limit=2)


TAB = Tab("Test-time register", OUTPUTS, layout, render, depends, wire, prepare=prepare, state=RegisterView)
