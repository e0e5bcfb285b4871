"""Quick answers: a patch click, a tile click and an upload answered before Gradio's event. The page's own script
asks the server for the new pictures directly, shows them, and only then hands the click or the file to Gradio, whose
event follows as before and finds the work done.

A Gradio event's round trip alone was most of what a patch click and an upload's maps cost (docs/figures.md, "Quick
answers").

- **A patch click.** The script (``SCRIPT``, in the page's head) sees the press of the pointer on the query image, maps
  it to the picture's pixel as Gradio's image does for its ``select`` event, and fetches ``CLICK_ROUTE``: the query
  image outlined at the clicked patch and the open tab's views of that query, drawn now (``tabs.base.drawn``, ahead).
  The click's event takes those views instead of drawing them again, and sets the query, its caption and the
  dropdown. Nothing that needs the model is drawn here: a tab whose views need model work (``Tab.prepare``), a patch
  whose rows a compact analysis did not keep, or a tab whose views do not follow the query leaves its views to the
  event.
- **A tile click** on the layers × heads grid (``TILE_ROUTE``): the grid with that tile's head selected and the head
  large, drawn ahead the same way; the tile's event takes them and sets the layer and head controls.
- **An upload** (a file chosen, once the page has analysed an image: the session says which model, inputs, tab and
  controls). The script posts the file to ``UPLOAD_ROUTE``, which analyses it as the upload's event does
  (``tabs.shared.upload_session``), keeps the session (``QuickAnswers.kept``) and draws the query image and the open
  tab. The upload's event (``QuickAnswers.analysis_event``) hands that session to the one upload path
  (``tabs.shared.analysis_answers``, ``made=``) instead of analysing again. A model whose upload answers in stages or
  takes seconds (``uploads_ahead``), a page's first upload, a paste or a drop goes through the event alone.

Which session a request is about is named by a key the page holds in a hidden element (``SESSION_KEY_ID``), written by
every analysis event (``QuickAnswers.keyed``); the tabs know nothing of it. Views drawn ahead reach the event through
the tab's own memo of what it last drew (``Screen.drawn``, ``tabs.base.drawn``).

While an answer is awaited the page's pictures are dimmed (``WAITING_CLASS``; after 0.15 s, so that a quick one does
not flicker): a held-back file shows no Gradio progress.

Every picture is written as a file in Gradio's cache, and the answer carries them back to back in one response. The
event sends the same files, so the page's components come to hold what the page shows.
"""

from __future__ import annotations

import functools
import hashlib
import json
import secrets
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import gradio as gr
from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from gradio.utils import get_upload_folder

from vit_explorer.core.targets import prompted
from vit_explorer.draw import pictures
from vit_explorer.errors import VitExplorerError
from vit_explorer.models import LoadedModel
from vit_explorer.web.session import Controls, ModelCache, Session
from vit_explorer.web.tabs import TABS, layers_heads
from vit_explorer.web.tabs.base import Tab, as_file, drawn
from vit_explorer.web.tabs.shared import analysis_answers, answers_twice, upload_controls, upload_session

CLICK_ROUTE = "/vit-explorer/patch-click"
TILE_ROUTE = "/vit-explorer/tile-click"
UPLOAD_ROUTE = "/vit-explorer/upload"
PICTURES_HEADER = "X-Pictures"  # a quick answer's pictures: "elem_id:length" each, in the body's order
WAITING_CLASS = "vit-explorer-waiting"  # on the page's body while a quick answer is awaited
SESSION_KEY_ID = "session-key"  # the page's hidden element whose ``data-session`` names its session to its script

# the dearest model whose uploads the page's script analyses ahead: DINOv2-S at 518 px is 60 GFLOP per forward pass,
# DINOv2-L at 518 px 834 GFLOP (what their uploads take: docs/figures.md, "In the browser")
AHEAD_FLOPS = 2e11
# uploads analysed ahead and not yet taken by their event: few and not for long. An answer whose event never came (a
# closed page) holds all of an image's maps (540 MB for DINOv2-S at 518 px), and an event comes within a second
KEPT_UPLOADS, KEPT_TTL_S = 2, 60.0


def nothing() -> Response:
    """No quick answer (HTTP 204): Gradio's event answers alone."""
    return Response(status_code=204)


def uploads_ahead(model: LoadedModel) -> bool:
    """Whether the page's script analyses a chosen file ahead of Gradio's event: not for a model whose upload answers in
    stages (``tabs.shared.answers_twice``), whose event shows its first maps early already, nor for one dearer than
    ``AHEAD_FLOPS``, whose seconds of analysis are better shown with the event's progress than as a dimmed page."""
    return not answers_twice(model) and model.forward_flops <= AHEAD_FLOPS


def image_digest(data: bytes) -> str:
    """An image file's bytes, named: the key of an upload's analysis ahead, and the folder its file is written to."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def analysis_key(upload: str, spec: str, controls: Controls) -> tuple:
    """What decides an upload's analysis: the image file's bytes, the model, the fit and the prompts."""
    return image_digest(Path(upload).read_bytes()), spec, controls.fit, controls.prompts


def open_tab(session: Session) -> tuple[Tab | None, Controls | None]:
    """The tab the page shows and the controls it was drawn with, as last drawn (``tabs.base.refresh``)."""
    return next((tab for tab in TABS if tab.title == session.screen.open_tab), None), session.screen.controls


def quick_views(session: Session, x: int, y: int) -> dict[str, str]:
    """The files of the views a click on the query image's pixel (``x``, ``y``) shows, by output name: the query image
    with the clicked patch outlined, and the open tab's views where they follow the query and need no model work."""
    analysis = session.analysis
    token = pictures.token_at(analysis, x, y, pictures.view_hw(analysis))
    views = {"query_image": as_file(pictures.image_picture(analysis, token))}
    tab, controls = open_tab(session)
    if tab is None or controls is None or not tab.follows_query or tab.prepare is not None \
            or not analysis.store.keeps_rows_of(token):
        return views
    # drawn for the clicked query without making it the session's: the event does that, with the caption and dropdown
    views.update(drawn(tab, replace(session, query=token), controls))
    return views


def tile_views(session: Session, x: int, y: int) -> dict[str, str]:
    """The files of the views a click on the layers × heads grid's pixel (``x``, ``y``) shows, by output name: the
    grid with that tile's head selected, and that head large; nothing on a label or the margin, or if the grid is not
    the open tab."""
    tab, controls = open_tab(session)
    tile = layers_heads.tile_at(session, x, y)
    if tab is not layers_heads.TAB or controls is None or tile is None:
        return {}
    layer, head = tile
    return drawn(tab, replace(session, layer=layer, head=head), controls)


class QuickAnswers:
    """What one page answers ahead of Gradio: its sessions by key, the uploads it analysed ahead (until their event
    takes them), and its pictures' element ids. ``web.app`` wires its analysis events through it (``keyed``,
    ``analysis_event``) and serves its routes (``add_routes``)."""

    def __init__(self, models: ModelCache) -> None:
        self.models = models
        self.elem_ids: dict[str, str] = {}  # the page's pictures' elem_id by output name
        self.sessions: weakref.WeakValueDictionary[str, Session] = weakref.WeakValueDictionary()  # gone with the state
        self.keys: weakref.WeakKeyDictionary[Session, str] = weakref.WeakKeyDictionary()
        # uploads analysed ahead, by what decides an analysis (``analysis_key``), with when each was made
        self.kept: OrderedDict[tuple, tuple[float, Session]] = OrderedDict()
        self.lock = threading.Lock()

    def key_html(self, session: Session | None) -> str:
        """The content of the hidden ``SESSION_KEY_ID`` element: the session's key (unguessable, as the page is its only
        holder), or nothing before an analysis; and whether the page's script sends a chosen file ahead of Gradio."""
        if session is None:
            return ""
        with self.lock:
            key = self.keys.setdefault(session, secrets.token_urlsafe(16))
            self.sessions[key] = session
        return f'<span data-session="{key}" data-uploads-ahead="{int(uploads_ahead(session.model(self.models)))}"></span>'

    def keyed(self, event: Callable[..., Iterator[tuple]], state_at: int) -> Callable[..., Iterator[tuple]]:
        """``event`` (a generator of output tuples whose ``state_at``-th is the session) with the session's key appended,
        for the ``SESSION_KEY_ID`` element wired as its last output."""

        @functools.wraps(event)  # Gradio reads the event's parameters (its progress bar) through the wrapper
        def with_key(*args) -> Iterator[tuple]:
            for outputs in event(*args):
                yield (*outputs, self.key_html(outputs[state_at]))

        return with_key

    def analysis_event(self, upload: str | None, spec: str, visible: str, *control_values) -> Iterator[tuple]:
        """An upload's event: ``tabs.shared.analysis_answers``, given the session its quick answer made, if there is one."""
        made = None if upload is None else self.take(upload, spec, upload_controls(Controls.from_values(control_values)))
        yield from analysis_answers(self.models, upload, spec, visible, *control_values, made=made)

    def analyse_ahead(self, upload: str, spec: str, controls: Controls) -> Session | None:
        """The upload's whole session (its evidence too), kept for the event that follows; None for a model dearer than
        ``uploads_ahead`` allows."""
        if not uploads_ahead(prompted(self.models.get(spec), controls.prompts)):
            return None
        session = upload_session(self.models, upload, spec, controls)
        now = time.monotonic()
        with self.lock:
            self.kept[analysis_key(upload, spec, controls)] = now, session
            while len(self.kept) > KEPT_UPLOADS or now - next(iter(self.kept.values()))[0] > KEPT_TTL_S:
                self.kept.popitem(last=False)
        return session

    def take(self, upload: str, spec: str, controls: Controls) -> Session | None:
        """The session ``analyse_ahead`` made for this upload, model and inputs, once; None if there is none."""
        with self.lock:
            if not self.kept:
                return None
            made, session = self.kept.pop(analysis_key(upload, spec, controls), (0.0, None))
        return session if time.monotonic() - made <= KEPT_TTL_S else None

    def uploaded_views(self, previous: Session, name: str, data: bytes) -> dict[str, str]:
        """The files of the views an upload of ``data`` (the file ``name``) shows, by output name, with the model, inputs,
        open tab and controls of the page's ``previous`` session: the query image and the open tab's views, where they
        need no model work beyond the analysis. Nothing for a model whose upload answers in stages or takes seconds
        (``uploads_ahead``) or an image that cannot be analysed (the event says why)."""
        tab, controls = open_tab(previous)
        if controls is None:
            return {}
        controls = upload_controls(controls)  # as the upload's event draws it
        # in Gradio's cache, named as Gradio names an upload: the same image name in the summary, deleted with the rest
        folder = Path(get_upload_folder()) / image_digest(data)
        folder.mkdir(parents=True, exist_ok=True)
        upload = folder / (Path(name).name if Path(name).name not in ("", ".", "..") else "image")  # never another folder
        upload.write_bytes(data)
        try:
            session = self.analyse_ahead(str(upload), previous.model_spec, controls)
        except VitExplorerError:
            return {}
        if session is None:
            return {}
        views = {"query_image": as_file(pictures.image_picture(session.analysis, session.query))}
        if tab is not None and tab.prepare is None:
            views.update(drawn(tab, session, controls))
        return views


def pictures_answer(views: dict[str, str], elem_ids: dict[str, str]) -> Response:
    """The pictures among ``views`` (output name → file) that the page shows, as one response: the PNG files back to back,
    their elements and lengths in a header (``PICTURES_HEADER``). Fetching each file after the answer took Gradio's file
    route 20–45 ms while the server was busy, and base64 in JSON cost as much to read."""
    shown = [(elem_ids[name], Path(path).read_bytes()) for name, path in views.items()
             if name in elem_ids and isinstance(path, str)]
    if not shown:
        return nothing()
    return Response(b"".join(data for _, data in shown), media_type="application/octet-stream",
                    headers={PICTURES_HEADER: ",".join(f"{elem_id}:{len(data)}" for elem_id, data in shown)})


# each page built (``web.app.build_demo``): what answers ahead for it
PAGES: weakref.WeakKeyDictionary[gr.Blocks, QuickAnswers] = weakref.WeakKeyDictionary()


def register(demo: gr.Blocks, ui: dict, answers: QuickAnswers) -> None:
    """Note the page ``demo``'s quick answers and pictures (``ui``: its components by name) for ``add_routes``."""
    answers.elem_ids = {name: component.elem_id for name, component in ui.items()
                        if isinstance(component, gr.Image) and component.elem_id}
    PAGES[demo] = answers


def add_routes(demo: gr.Blocks) -> None:
    """Serve the quick answers from the launched page ``demo`` (Gradio makes its server app at launch); an upload larger
    than the page's ``max_file_size`` is left to Gradio, which refuses it with its own message."""
    answers = PAGES[demo]
    max_upload_bytes = demo.max_file_size or float("inf")

    def click_route(views: Callable[[Session, int, int], dict[str, str]]) -> Callable[[str, int, int], Response]:
        def answer(session: str, x: int, y: int) -> Response:
            held = answers.sessions.get(session)
            if held is None:  # gone with its state's time to live, or another server's
                return nothing()
            return pictures_answer(views(held, x, y), answers.elem_ids)

        return answer

    async def upload(request: Request, session: str, name: str) -> Response:
        held = answers.sessions.get(session)
        length = int(request.headers.get("content-length") or 0)
        if held is None or not 0 < length <= max_upload_bytes:
            return nothing()
        data = await request.body()
        return pictures_answer(await run_in_threadpool(answers.uploaded_views, held, name, data), answers.elem_ids)

    demo.app.add_api_route(CLICK_ROUTE, click_route(quick_views), methods=["GET"], include_in_schema=False)
    demo.app.add_api_route(TILE_ROUTE, click_route(tile_views), methods=["GET"], include_in_schema=False)
    demo.app.add_api_route(UPLOAD_ROUTE, upload, methods=["POST"], include_in_schema=False)
    # first, before Gradio's own routes, some of which match any path
    routes = demo.app.router.routes
    routes[:0] = [routes.pop() for _ in range(3)]


# Gradio's image maps a click to the picture's pixel like this (``get_coordinates_of_clicked_image``, Gradio 6): the
# picture is shown at most at its natural size, centred in its box. The same mapping here picks the same patch.
# The click or the file is held back from Gradio until the quick answer is on screen (at most ``HOLD_MS``), then given to
# it again: a click's event, sent at once, took the server's time while the quick answer was being drawn
# (docs/figures.md, "Quick answers"), and an upload's would analyse the image a second time.
HOLD_MS = {"click": 1000, "upload": 30_000}  # an upload's analysis ahead may take a few seconds (``uploads_ahead``)
# the pictures a click on which is answered at once, by their element's id: the query image and the layers × heads grid
CLICK_ROUTES = {"query-image": CLICK_ROUTE, "grid": TILE_ROUTE}
CLICKABLE_SELECTOR = ", ".join(f"#{elem_id} button" for elem_id in CLICK_ROUTES)
# what the page script needs of the server, and the script itself, a file beside this one
SCRIPT_CONFIG = {"routes": {elem_id: route.lstrip("/") for elem_id, route in CLICK_ROUTES.items()},
                 "uploadRoute": UPLOAD_ROUTE.lstrip("/"), "sessionKeyId": SESSION_KEY_ID, "waitingClass": WAITING_CLASS,
                 "picturesHeader": PICTURES_HEADER, "clickable": CLICKABLE_SELECTOR, "holdMs": HOLD_MS}
SCRIPT = (f"<script>window.vitExplorerQuickAnswer = {json.dumps(SCRIPT_CONFIG)};</script>\n"
          f"<script>\n{(Path(__file__).parent / 'quick_answer.js').read_text()}</script>")
