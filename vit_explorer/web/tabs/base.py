"""What an app tab is, and how tabs render lazily.

A tab is a ``Tab``: a title, the names of the components its views fill (``outputs``), a ``layout`` that
builds its components, a ``render`` that fills its outputs from the session and the controls, and
``depends``: the part of session and controls its views are drawn from. A tab renders when it is opened,
and while it is open when what it depends on changes; ``Screen.shown`` keeps what each tab last drew
from, so that opening a tab again redraws nothing unless that changed. Components and callbacks are
bound by name (``in_order``), never by position.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import gradio as gr
import numpy as np
from gradio.utils import get_upload_folder

from vit_explorer.draw import files
from vit_explorer.errors import VitExplorerError
from vit_explorer.web.session import CONTROL_NAMES, Controls, ModelCache, Session

MAP_VIEW = "map-view"  # the class of pictures with text in them (maps, grid)
MAP_BUTTONS = ["download", "fullscreen"]


@dataclass(frozen=True)
class Tab:
    """One tab of the app.

    Args:
        title: its label; also its key in ``Screen.shown`` and, as a slug, in its event's API name.
        outputs: names of the components ``render`` fills (each name unique across the app).
        layout: builds its components inside the ``gr.Tab`` and returns them by name: outputs and controls.
        render: ``(session, controls) -> {output name: value}``, every name of ``outputs``.
        depends: ``(session, controls) -> key``; equal keys mean the views on screen are current.
        wire: wires its own events (``Wiring``); the view controls of ``CONTROL_NAMES`` are wired by the app.
        ranges: names of its controls whose range or choices follow the analysis.
        set_ranges: ``session -> {name of ranges: gr.update(...)}``, for a new analysis.
        target_ranges: its ranges follow the target too (a backbone's similarity target opens the class-specific maps).
        prepare: ``(session, controls) -> None``: the model work its views need, done before it draws by an explicit
            call with the session's model (AttnLRP's and LeGrad's maps); drawing itself never runs the model.
        waiting: ``(session, controls, target) -> {output name: value}``: its views while the model computes what they
            need for ``target`` (``prepare``, or a new target's pass): those that would meanwhile show another method's
            or target's map, cleared, with a line naming what is coming; {} when what they need is at hand.
        follows_query: its views show the query token's: a new query redraws them (the others are left out of the
            query's events, whose every unchanged output costs Gradio a rebuilt component).
        state: makes the tab's own view state, a dataclass of its module (a clicked head, a slider's layer, the last
            score), kept per analysis on the session's screen and read with ``state_of``; None for a tab without one.
    """

    title: str
    outputs: tuple[str, ...]
    layout: Callable[[], dict[str, Any]]
    render: Callable[..., dict[str, Any]]
    depends: Callable[..., Hashable]
    wire: Callable[[Wiring], None] | None = None
    ranges: tuple[str, ...] = ()
    set_ranges: Callable[[Session], dict[str, Any]] | None = None
    target_ranges: bool = False
    prepare: Callable[[Session, Controls], None] | None = None
    waiting: Callable[[Session, Controls, int | str | None], dict[str, Any]] | None = None
    follows_query: bool = False
    state: Callable[[], Any] | None = None

    @property
    def slug(self) -> str:
        """The title as an identifier: "Layers × heads" → "layers_heads"."""
        return re.sub(r"\W+", "_", self.title.lower()).strip("_")


@dataclass(frozen=True)
class Wiring:
    """What a tab's events are wired with: every component of the app by name, and the shared model cache."""

    ui: dict[str, Any]
    models: ModelCache
    cache_ttl_s: int

    def __getitem__(self, name: str) -> Any:
        return self.ui[name]

    def all(self, names: Iterable[str]) -> list:
        """The components ``names``, in that order (an unknown name raises)."""
        return [self.ui[name] for name in names]

    @property
    def controls(self) -> list:
        """The control components, in ``CONTROL_NAMES`` order: the order ``Controls.from_values(values)`` reads them in."""
        return self.all(CONTROL_NAMES)


def state_of(tab: Tab, session: Session) -> Any:
    """The tab's own view state for the session's analysis (``Tab.state``), made when first asked for."""
    return session.screen.tabs.setdefault(tab.title, tab.state())


def in_order(values: dict[str, object], names: tuple[str, ...]) -> tuple:
    """``values`` by name → the tuple Gradio expects for the outputs ``names``, every picture written as a file
    (``as_file``); a missing or unknown name raises."""
    if set(values) != set(names):
        raise KeyError(f"outputs {sorted(set(names) ^ set(values))} are missing or unknown")
    return tuple(as_file(values[name]) for name in names)


def as_file(value: object) -> object:
    """An RGB picture ``[H, W, 3]`` uint8 (bare or as an update's value) as the path ``files.screen_png`` writes it to, in
    Gradio's cache, where Gradio serves it as it is. Gradio's own PNG encoder is three times slower: on an upload most
    of the server's time went to it. Anything else as it is."""
    if isinstance(value, np.ndarray) and value.ndim == 3 and value.shape[-1] == 3 and value.dtype == np.uint8:
        return files.screen_png(value, get_upload_folder())
    if isinstance(value, dict) and "value" in value:
        return {**value, "value": as_file(value["value"])}
    return value


def unchanged(names: Iterable[str]) -> dict[str, Any]:
    """No change to the outputs ``names``."""
    return {name: gr.update() for name in names}


def refresh(tab: Tab, session: Session, controls: Controls) -> dict[str, Any]:
    """The tab's views, drawn only if what they depend on changed since the tab last drew for this analysis. The tab
    is the open one: a quick answer (a click, an upload) draws it next, with these controls (``web.quick_answer``)."""
    session.screen.open_tab, session.screen.controls = tab.title, controls
    key = tab.depends(session, controls)
    if session.screen.shown.get(tab.title) == key:
        return unchanged(tab.outputs)
    values = drawn(tab, session, controls)
    session.screen.shown[tab.title] = key
    return values


def drawn(tab: Tab, session: Session, controls: Controls) -> dict[str, Any]:
    """The tab's views for the session as it is, pictures as files (``as_file``), and kept as what the tab last drew
    (``Screen.drawn``): asked again for the same (a quick answer drew a click's views ahead of its Gradio event,
    ``web.quick_answer``, and the event's ``refresh`` asks next), it hands back the same files, so that the page's
    components come to hold what the page already shows and nothing is drawn twice."""
    key = tab.depends(session, controls)
    with session.screen.drawing:  # the quick answer and the event may come at once: the second waits for the first
        last = session.screen.drawn.get(tab.title)
        if last is not None and last[0] == key:
            return last[1]
        if tab.prepare is not None:
            tab.prepare(session, controls)
        values = {name: as_file(value) for name, value in tab.render(session, controls).items()}
        session.screen.drawn[tab.title] = (key, values)
    return values


def user_errors(callback: Callable) -> Callable:
    """Show a ``VitExplorerError`` raised by ``callback`` as a message in the page, not a bare "Error"."""

    @functools.wraps(callback)
    def wrapped(*args, **kwargs):
        try:
            return callback(*args, **kwargs)
        except VitExplorerError as error:
            raise gr.Error(str(error), print_exception=False) from None

    return wrapped


def counter(progress: Callable | None, total: int, description: str, unit: str) -> Callable[[], None] | None:
    """A step callback for a method's long work (``step=``) that moves Gradio's progress bar (``gr.Progress``, which
    Gradio passes to an event function that has one as a default) one of ``total`` steps; None without a bar."""
    if progress is None:
        return None
    done = 0
    progress((0, total), desc=description, unit=unit)

    def step() -> None:
        nonlocal done
        done += 1
        progress((done, total), desc=description, unit=unit)

    return step


def run_progress(progress: Callable | None) -> Callable[[str, int, str], Callable[[], None]]:
    """Gradio's progress bar as the run layer's ``Progress``: each stage moves the bar through its steps (``counter``),
    its description the bar's words."""

    def stage(description: str, total: int, unit: str) -> Callable[[], None]:
        step = counter(progress, total, description, unit) if total else None
        return step or (lambda: None)

    return stage


def require(session: Session | None) -> Session:
    """The session, or a message that there is nothing to show yet."""
    if session is None:
        raise gr.Error("Upload an image first.", print_exception=False)
    return session


def map_image(elem_id: str, label: str, **options: Any) -> gr.Image:
    """A picture with text in it (map, grid): shown at its natural size, no floating label over it
    (a Markdown caption goes above), its buttons on a line of their own (``MAP_VIEW`` in the app's CSS)."""
    return gr.Image(show_label=False, label=label, format="png", interactive=False, buttons=MAP_BUTTONS, elem_classes=MAP_VIEW,
                    elem_id=elem_id, **options)
