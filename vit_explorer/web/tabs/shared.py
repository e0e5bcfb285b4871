"""The events every tab follows: an upload (or model or fit change) analyses the image; a view control
changes; the query changes (patch click, dropdown, reset); a tab is opened. Each draws the page's shared
views and, of the tabs, only the one that is open, and only where what it shows changed (``base.refresh``);
the other tabs draw when they are opened."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import gradio as gr

from vit_explorer import run
from vit_explorer.core import maps
from vit_explorer.core.targets import Target, prompted
from vit_explorer.draw import pictures
from vit_explorer.errors import VitExplorerError
from vit_explorer.models import LoadedModel, stage_specs
from vit_explorer.web.captions import (
    MEAN_PATCHES,
    model_summary,
    query_caption,
    query_choices,
    query_label,
    target_choices,
    top_predictions,
)
from vit_explorer.web.session import (
    SIMILARITY_TARGETS,
    Controls,
    ModelCache,
    Session,
    model_choices,
    new_session,
    query_place,
)
from vit_explorer.web.tabs import TABS
from vit_explorer.web.tabs.base import Tab, in_order, refresh, require, unchanged, user_errors

FIRST_TAB = TABS[0].title  # the tab a new page shows
TAB_OUTPUTS = tuple(name for tab in TABS for name in tab.outputs)
RANGES = tuple(name for tab in TABS for name in tab.ranges)
QUERY_OUTPUTS = ("query_image", "caption", "query")
# what an analysis fills, by name: the app wires these components in this order, and the callbacks return them by name
# (API clients read the summary, the query image and the predictions first)
FULL_OUTPUTS = ("state", "summary", "query_image", "top5", "target", "caption", "query", *TAB_OUTPUTS, *RANGES)
QUERY_TAB_OUTPUTS = tuple(name for tab in TABS if tab.follows_query for name in tab.outputs)
QUERIED = ("state", *QUERY_OUTPUTS, *QUERY_TAB_OUTPUTS)
# the tabs whose ranges follow the target, and those ranges
TARGET_TABS = tuple(tab for tab in TABS if tab.target_ranges)
TARGETED = ("state", *TAB_OUTPUTS, *(name for tab in TARGET_TABS for name in tab.ranges))


def tab_views(session: Session, controls: Controls, visible: str, *, clear_hidden: bool = False) -> dict:
    """Every tab's outputs: the ``visible`` tab's drawn where they changed, the others' unchanged (or
    cleared, ``clear_hidden``, so that no tab shows an earlier image until it is opened)."""
    values = {}
    for tab in TABS:
        if tab.title == visible:
            values.update(refresh(tab, session, controls))
        else:
            values.update(dict.fromkeys(tab.outputs) if clear_hidden else unchanged(tab.outputs))
    return values


def query_update(session: Session) -> dict:
    """The query dropdown, showing the current query."""
    return gr.update(choices=query_choices(session.analysis, session.query), value=query_label(session))


def query_views(session: Session) -> dict:
    """The query image (its patch outlined), its caption and the query dropdown (``QUERY_OUTPUTS``)."""
    return {"query_image": pictures.image_picture(session.analysis, session.query), "caption": query_caption(session),
            "query": query_update(session)}


def target_update(session: Session) -> dict:
    """The target dropdown beside the model: every class, the target chosen; for a backbone, its similarity targets."""
    if session.evidence is None and session.analysis.num_classes:
        return gr.update(choices=[], value=None, interactive=False, info=TARGET_PENDING)
    if session.analysis.num_classes == 0 or session.analysis.similarity:
        choices = [(label, key) for key, label in SIMILARITY_TARGETS.items()]
        return gr.update(choices=choices, value=session.similarity_choice, interactive=True, info=SIMILARITY_INFO,
                         label="Target (a similarity)")
    return gr.update(choices=target_choices(session.analysis), value=session.target, interactive=True, info=TARGET_INFO,
                     label="Target class")


TARGET_INFO = "what Class maps, Head ablation and Compare explain; type to search"
# a dear classifier's maps are shown before its top class's evidence is (``analysis_answers``)
TARGET_PENDING = "the top class's gradients are being taken (one forward and backward pass)…"
SIMILARITY_INFO = ("a backbone has no classes: its class maps and head ablation can explain the image's embedding, or what the "
                   "query patch's own output token is made of (click a patch first)")


@user_errors
def on_target(models: ModelCache, session: Session | None, target: int | None, visible: str, *control_values,
              redraw: bool = False) -> tuple:
    """Another target class, chosen beside the model for every tab that explains one: one forward and backward
    pass (none for a target seen before on this image); the open tab redraws (``TARGETED``). The target already chosen
    changes nothing, unless the open tab is to be drawn again (``redraw``: its views were cleared meanwhile)."""
    session = require(session)
    # Gradio's dropdown sends its value again when it loses focus, as the first event may still run: one at a time, and
    # the second finds its target chosen (redrawing the open tab with the controls of its moment would show a stale map)
    with session.choosing:
        if is_chosen(session, target):
            if not redraw:
                return in_order({"state": session, **unchanged(TARGETED[1:])}, TARGETED)
            session.screen.shown.pop(visible, None)
        elif target in SIMILARITY_TARGETS:
            choose_similarity(models, session, target)
        elif session.evidence is not None and target is not None:
            session.evidence = run.evidence(session.model(models), session.analysis, int(target), decompose=True)
    ranges = {name: value for tab in TARGET_TABS for name, value in tab.set_ranges(session).items()}
    return in_order({"state": session, **tab_views(session, Controls.from_values(control_values), visible), **ranges}, TARGETED)


def is_chosen(session: Session, target: int | str | None) -> bool:
    """Whether ``target`` is the one the session's views already explain: the same class, or the same similarity (for
    the query patch's, of the same patch)."""
    if target in SIMILARITY_TARGETS:
        return (session.analysis.similarity and target == session.similarity_choice
                and (target == "own" or query_patch(session) == session.similarity_patch))
    chosen_class = target is not None and session.evidence is not None and not session.analysis.similarity
    return chosen_class and session.target == int(target)


def query_patch(session: Session) -> tuple[int, int] | None:
    return None if session.query is None else session.analysis.layout.token_patch(session.query)


def choose_similarity(models: ModelCache, session: Session, choice: str) -> None:
    """A backbone's similarity target (``core.targets``): to its own embedding, or to the query patch's. The session's
    analysis becomes the similarity model's (the same maps, one score as its "class"), with that score's evidence:
    one forward and one backward pass."""
    patch = None
    if choice == "patch":
        patch = query_patch(session)
        if patch is None:
            raise VitExplorerError("click a patch of the image first: the query patch's target needs a patch as the query")
    base = models.get(session.model_spec)
    # only the image is read from the analysis shown, which may be another similarity's
    similarity, analysis, _ = run.retarget(base, session.analysis, Target(patch), models.memory_budget, decompose=True)
    query, layer, head = session.query, session.layer, session.head
    session.analysis, session.target_model, session.similarity_choice = analysis, similarity, choice
    session.similarity_patch = patch
    session.evidence = run.evidence(similarity, analysis, 0, decompose=True)
    session.query, session.layer, session.head = query, layer, head
    session.screen = type(session.screen)()  # every result on screen was for another target


def empty_outputs(summary: str = "Upload an image to begin.") -> tuple:
    """``FULL_OUTPUTS`` before any upload (or after one that could not be analysed, ``summary`` saying why): nothing shown."""
    values: dict[str, object] = dict.fromkeys(FULL_OUTPUTS)
    # the previous image's target and query would otherwise stay beside a summary that says nothing is analysed
    values.update(summary=summary, caption="", query=gr.update(choices=[], value=None),
                  target=gr.update(choices=[], value=None, interactive=False, info=TARGET_INFO, label="Target class"),
                  top5=gr.update(value=None, visible=False),
                  **unchanged(RANGES))
    return in_order(values, FULL_OUTPUTS)


UNREADABLE = "This image could not be analysed"


# a classifier dearer than this per forward pass shows the maps of a forward pass first, then the target's evidence (a
# ViT-B/16 at 224 px is 35 GFLOP, the shipped model 0.1; what it gains: docs/figures.md, "A dear classifier")
STAGED_FLOPS = 2e9


def run_analysis(models: ModelCache, upload: str | None, spec: str, visible: str, *control_values,
                 place: tuple[float, float] | None = None) -> tuple:
    """Upload (or model change) → the views of its analysis (``FULL_OUTPUTS``): the last of ``analysis_answers``."""
    *_, last = analysis_answers(models, upload, spec, visible, *control_values, place=place)
    return last


def analysis_answers(models: ModelCache, upload: str | None, spec: str, visible: str, *control_values,
                     made: Session | None = None, place: tuple[float, float] | None = None) -> Iterator[tuple]:
    """Upload → one forward pass, and one backward pass for the top class → the shared views and the ``visible``
    tab's; the other tabs are cleared, to be drawn when opened (``FULL_OUTPUTS``). A classifier dearer than
    ``STAGED_FLOPS`` answers twice: first the views of a forward pass without a graph, then, after one forward and
    backward pass for the top class's evidence and decomposition, every view again with them. ``made``: the upload's
    session made already (``upload_session``, by the page's quick answer, ``web.quick_answer``), shown as it is.
    ``place``: where on the image the query patch was before (``session.query_place``), kept as the query.

    An image that cannot be analysed (not an image, too large, …) empties the views and says why, in the summary and in
    one notice: raising would also stamp a red "Error" on each of the event's outputs."""
    if upload is None:
        yield empty_outputs()
        return
    try:
        yield from analysed_outputs(models, upload, spec, visible, upload_controls(Controls.from_values(control_values)), made,
                                    place)
    except VitExplorerError as error:
        gr.Warning(str(error), title=UNREADABLE)
        yield empty_outputs(f"⚠️ **{UNREADABLE}:** {error}")


def upload_controls(controls: Controls) -> Controls:
    """The controls an upload is analysed and drawn with: the start-layer slider goes back to 0 (``rollout.set_ranges``)."""
    return replace(controls, start_layer=0)


def analysed_outputs(models: ModelCache, upload: str, spec: str, visible: str, controls: Controls,
                     made: Session | None, place: tuple[float, float] | None = None) -> Iterator[tuple]:
    """``analysis_answers`` of an upload, raising a ``VitExplorerError`` where it cannot be analysed."""
    if made is not None:
        yield analysed_views(made, controls, visible)
        return
    model = prompted(models.get(spec), controls.prompts)
    staged = answers_twice(model)
    session = first_session(models, model, upload, spec, controls, explain=not staged)
    if place is not None:  # the patch of this grid that covers it
        session.query = pictures.token_at(session.analysis, place[1], place[0], (1, 1))
    if staged:
        yield analysed_views(session, controls, visible)
        session.screen = type(session.screen)()  # what was drawn without the evidence is drawn again
    add_evidence(model, session)
    yield analysed_views(session, controls, visible)


def answers_twice(model: LoadedModel) -> bool:
    """Whether an upload shows this model's maps before its evidence: a classifier dearer than ``STAGED_FLOPS``."""
    return bool(model.num_classes) and model.forward_flops > STAGED_FLOPS


def first_session(models: ModelCache, model: LoadedModel, upload: str, spec: str, controls: Controls, explain: bool) -> Session:
    """The session of one analysis of ``upload`` (with the top class's evidence where ``explain``)."""
    # the Head contributions tab's decomposition is read off the upload's pass (the evidence's pass, when staged)
    analysis = run.analyse(model, upload, name=Path(upload).name, memory_budget=models.memory_budget, fit=controls.fit,
                       explain=explain, decompose=True)
    session = new_session(analysis, spec, None, models)
    session.target_model = model if analysis.prompted else None
    return session


def upload_session(models: ModelCache, upload: str, spec: str, controls: Controls) -> Session:
    """The whole session of an upload, the top class's evidence and decomposition too, in one forward and backward pass:
    what the page's quick answer makes ahead of the upload's event (``web.quick_answer``)."""
    model = prompted(models.get(spec), controls.prompts)
    session = first_session(models, model, upload, spec, controls, explain=True)
    add_evidence(model, session)
    return session


def add_evidence(model: LoadedModel, session: Session) -> None:
    """The session's evidence: the top class's gradients and decomposition (one forward and backward pass, none where
    the analysis's own pass took them); none for a model without classes."""
    session.evidence = run.evidence(model, session.analysis, decompose=True)


def analysed_views(session: Session, controls: Controls, visible: str) -> tuple:
    """``FULL_OUTPUTS`` of a new analysis."""
    analysis = session.analysis
    # a backbone has no predictions: no empty box (the summary says "Backbone: no classifier head")
    label = "Zero-shot over the prompts" if analysis.prompted else "Top-5 predictions"
    top5 = (gr.update(value=top_predictions(analysis), visible=True, label=label) if analysis.num_classes
            else gr.update(value=None, visible=False))
    values = {"state": session, "summary": model_summary(analysis), "top5": top5,
              "target": target_update(session), **query_views(session),
              **tab_views(session, controls, visible, clear_hidden=True)}
    # before a classifier's evidence has come, the controls that follow the target keep the user's choice (a method)
    pending = session.evidence is None and analysis.num_classes > 0
    for tab in TABS:
        if tab.set_ranges is not None:
            values.update(unchanged(tab.ranges) if pending and tab.target_ranges else tab.set_ranges(session))
    return in_order(values, FULL_OUTPUTS)


def on_model_change(models: ModelCache, spec: str, current: str, upload: str | None, session: Session | None, visible: str,
                    *control_values, progress: Callable | None = None) -> tuple:
    """Switch model; on failure keep the previous one (and its maps) and say why. The current model's spec, the
    model dropdown, then ``FULL_OUTPUTS``. Loading a hub model not yet cached is a download: ``progress`` says so."""
    if progress is not None:
        progress((0, 2), desc=f"loading {spec} (a hub model downloads once)", unit="step")
    try:
        model = models.get(spec)
    except VitExplorerError as error:
        gr.Warning(f"{error} — still using {current}.")
        unchanged_views = in_order({"state": session, **unchanged(FULL_OUTPUTS[1:])}, FULL_OUTPUTS)
        return (current, gr.update(value=current), *unchanged_views)
    if progress is not None:
        progress((1, 2), desc="analysing the image", unit="step")
    choices = gr.update(choices=model_choices(spec, stage_specs(model)))  # a Swin's stages offered beside it
    # a clicked patch stays where it was on the image: on another stage's grid, the patch that covers it
    place = query_place(session.analysis, session.query) if session is not None else None
    return (spec, choices, *run_analysis(models, upload, spec, visible, *control_values, place=place))


@user_errors
def on_controls(session: Session | None, visible: str, *control_values) -> tuple:
    """A view control changed: the open tab redraws from the cached maps if it shows what changed; no forward
    pass (``TAB_OUTPUTS``)."""
    return in_order(tab_views(require(session), Controls.from_values(control_values), visible), TAB_OUTPUTS)


def waiting_outputs(session: Session | None, visible: str, target: int | str | None, control_values: tuple,
                    outputs: tuple[str, ...]) -> Iterator[tuple]:
    """What the page shows first while the model works for the ``visible`` tab (a new method's passes, a new ``target``'s;
    None: the session's): its views that would meanwhile show another method's or target's map, cleared, with a line
    naming what is coming (``Tab.waiting``); nothing when nothing waits for the model."""
    tab = next((tab for tab in TABS if tab.title == visible), None)
    if session is None or tab is None or tab.waiting is None:
        return
    controls = Controls.from_values(control_values)
    if target is None and session.screen.shown.get(tab.title) == tab.depends(session, controls):
        return  # drawn already: nothing will be redrawn
    views = tab.waiting(session, controls, target)
    if views:
        kept = {"state": session} if "state" in outputs else {}  # a state is sent as it is, never as an update
        yield in_order({**unchanged(outputs), **kept, **views}, outputs)


def controls_answers(session: Session | None, visible: str, *control_values) -> Iterator[tuple]:
    """``on_controls`` as the page runs it: the views that wait for the model cleared first (``waiting_outputs``)."""
    yield from waiting_outputs(session, visible, None, control_values, TAB_OUTPUTS)
    yield on_controls(session, visible, *control_values)


def target_answers(models: ModelCache, session: Session | None, target: int | str | None, visible: str,
                  *control_values) -> Iterator[tuple]:
    """``on_target`` as the page runs it: the views that wait for the target's pass cleared first (``waiting_outputs``),
    and then drawn again whoever chose the target meanwhile."""
    waited = False
    if session is not None and not is_chosen(session, target):
        for early in waiting_outputs(session, visible, target, control_values, TARGETED):
            waited = True
            yield early
    yield on_target(models, session, target, visible, *control_values, redraw=waited)


def show_visible(session: Session | None, visible: str, *control_values) -> tuple:
    """After an analysis: the tab open now, where another was open when it began (``TAB_OUTPUTS``)."""
    if session is None:
        return in_order(unchanged(TAB_OUTPUTS), TAB_OUTPUTS)
    return on_controls(session, visible, *control_values)


def opener(tab: Tab) -> Callable[..., tuple]:
    """The callback of opening ``tab``: which tab is open, then its outputs, drawn if what they show changed."""

    @user_errors
    def on_open(session: Session | None, *control_values) -> tuple:
        if session is None:
            return (tab.title, *in_order(unchanged(tab.outputs), tab.outputs))
        return (tab.title, *in_order(refresh(tab, session, Controls.from_values(control_values)), tab.outputs))

    return on_open


def opening_answers(tab: Tab) -> Callable[..., Iterator[tuple]]:
    """``opener(tab)`` as the page runs it: the views that wait for the model cleared first (``waiting_outputs``)."""
    on_open = opener(tab)

    def answers(session: Session | None, *control_values) -> Iterator[tuple]:
        for early in waiting_outputs(session, tab.title, None, control_values, tab.outputs):
            yield (tab.title, *early)
        yield on_open(session, *control_values)

    return answers


def follow_query(session: Session, visible: str, control_values: tuple) -> tuple:
    """The views that follow a new query: the query image, caption and dropdown, and the open tab where it follows the
    query (``QUERIED``)."""
    views = tab_views(session, Controls.from_values(control_values), visible)
    values = {"state": session, **query_views(session), **{name: views[name] for name in QUERY_TAB_OUTPUTS}}
    return in_order(values, QUERIED)


@user_errors
def on_patch_click(models: ModelCache, evt: gr.SelectData, session: Session | None, visible: str, *control_values) -> tuple:
    """A patch clicked: the query views follow it. A compact analysis kept no patch query's rows, so they
    are recomputed here, with the model from the cache, before any view reads them."""
    session = require(session)
    token = pictures.token_at(session.analysis, evt.index[0], evt.index[1], pictures.view_hw(session.analysis))
    run.query_rows(session.model(models), session.analysis, token)
    session.query = token
    return follow_query(session, visible, control_values)


@user_errors
def on_query_token(models: ModelCache, evt: gr.SelectData, session: Session | None, visible: str, *control_values) -> tuple:
    """A token chosen by its index (a query point clicked in the Queries and keys tab): the query views follow it."""
    session = require(session)
    token = int(evt.index)
    if not 0 <= token < session.analysis.layout.num_tokens:
        raise VitExplorerError(f"token {token} is not one of this image's {session.analysis.layout.num_tokens} tokens")
    run.query_rows(session.model(models), session.analysis, token)
    session.query = token
    return follow_query(session, visible, control_values)


@user_errors
def on_query_choice(session: Session | None, choice: str | None, visible: str, *control_values) -> tuple:
    """A query picked from the dropdown: the query views follow it, and the dropdown shows it."""
    session = require(session)
    if choice in query_choices(session.analysis):  # else nothing, or the clicked patch that is already the query
        session.query = None if choice == MEAN_PATCHES else session.analysis.layout.prefix_names.index(choice)
    # the dropdown too: a patch entry left from an earlier click goes once another query is chosen
    return follow_query(session, visible, control_values)


@user_errors
def on_reset_query(session: Session | None, visible: str, *control_values) -> tuple:
    """Back to the default query (the class token, or the mean of patch queries)."""
    session = require(session)
    session.query = maps.default_query(session.analysis)
    return follow_query(session, visible, control_values)
