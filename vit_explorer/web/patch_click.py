"""A patch click answered at once: the page's own script asks the server for the clicked query's pictures directly and
shows them, then hands the click to Gradio.

Through a Gradio event a patch click took 0.25–0.3 s on 2 cores, of which the drawing was 35–60 ms: Gradio's client took
45–70 ms to send the request, and 75–110 ms after the event to put the pictures on screen. The script (``SCRIPT``, in
the page's head) sees the press of the pointer on the query image, maps it to the picture's pixel as Gradio's image does
for its ``select`` event, and fetches ``ROUTE``: the query image outlined at the clicked patch and the open tab's views
of that query, drawn now (``tabs.base.drawn``) and written as files in Gradio's cache, sent back in one answer. It shows
them once all are decoded, and only then lets the click reach Gradio. The click's event runs as before, but its
``refresh`` takes the views drawn ahead instead of drawing them again. It sends the same files, so the page's
components come to hold what the page shows, and it sets the query, its caption and the dropdown.

The quick answer draws nothing that needs the model. A tab whose views need model work (``Tab.prepare``), a patch whose
rows a compact analysis did not keep, or a tab whose views do not follow the query leaves its views to the event.
"""

from __future__ import annotations

import weakref
from dataclasses import replace
from pathlib import Path

import gradio as gr
from fastapi.responses import Response

from vit_explorer.draw import pictures
from vit_explorer.web.session import SESSIONS, Session
from vit_explorer.web.tabs import TABS
from vit_explorer.web.tabs.base import as_file, drawn

ROUTE = "/vit-explorer/patch-click"
PICTURES_HEADER = "X-Pictures"  # the quick answer's pictures: "elem_id:length" each, in the body's order
SESSION_KEY_ID = "session-key"  # the hidden element whose ``data-session`` names the page's session to the script


def session_key_html(session: Session | None) -> str:
    """The content of the hidden ``SESSION_KEY_ID`` element: the session's key, or nothing before an analysis."""
    return "" if session is None else f'<span data-session="{session.key}"></span>'


def quick_views(session: Session, x: int, y: int) -> dict[str, str]:
    """The files of the views a click on the query image's pixel (``x``, ``y``) shows, by output name: the query image
    with the clicked patch outlined, and the open tab's views where they follow the query and need no model work."""
    analysis = session.analysis
    token = pictures.token_at(analysis, x, y, pictures.view_hw(analysis))
    views = {"query_image": as_file(pictures.image_picture(analysis, token))}
    tab = next((tab for tab in TABS if tab.title == session.screen.open_tab), None)
    controls = session.screen.controls
    if tab is None or controls is None or not tab.follows_query or tab.prepare is not None \
            or not analysis.store.keeps_rows_of(token):
        return views
    # drawn for the clicked query without making it the session's: the event does that, with the caption and dropdown
    views.update(drawn(tab, replace(session, query=token), controls, ahead=True))
    return views


# each page built (``web.app.build_demo``): its pictures' ``elem_id`` by output name, where the script finds them
PICTURE_IDS: weakref.WeakKeyDictionary[gr.Blocks, dict[str, str]] = weakref.WeakKeyDictionary()


def register(demo: gr.Blocks, ui: dict) -> None:
    """Note the pictures of the page ``demo`` (``ui``: its components by name) for ``add_route``."""
    PICTURE_IDS[demo] = {name: component.elem_id for name, component in ui.items()
                         if isinstance(component, gr.Image) and component.elem_id}


def add_route(demo: gr.Blocks) -> None:
    """Serve ``ROUTE`` from the launched page ``demo`` (Gradio makes its server app at launch)."""
    elem_ids = PICTURE_IDS[demo]

    def patch_click(session: str, x: int, y: int) -> Response:
        held = SESSIONS.get(session)
        if held is None:  # gone with its state's time to live, or another server's: the event answers alone
            return Response(status_code=204)
        shown = [(elem_ids[name], Path(path).read_bytes()) for name, path in quick_views(held, x, y).items()
                 if name in elem_ids and isinstance(path, str)]
        # the PNG files one after another in one answer, their elements and lengths in a header: fetching each file
        # after the answer took Gradio's file route 20–45 ms, and base64 in JSON cost as much to read
        return Response(b"".join(data for _, data in shown), media_type="application/octet-stream",
                        headers={PICTURES_HEADER: ",".join(f"{elem_id}:{len(data)}" for elem_id, data in shown)})

    demo.app.add_api_route(ROUTE, patch_click, methods=["GET"], include_in_schema=False)
    # first, before Gradio's own routes, some of which match any path
    demo.app.router.routes.insert(0, demo.app.router.routes.pop())


# Gradio's image maps a click to the picture's pixel like this (``get_coordinates_of_clicked_image``, Gradio 6): the
# picture is shown at most at its natural size, centred in its box. The same mapping here picks the same patch.
# The click itself is held back from Gradio until the quick answer is on screen (at most ``HOLD_MS``), then given to it
# again: its event, sent at once, took the server's time while the quick answer was being drawn (0.1 s instead of 0.04).
HOLD_MS = 1000
SCRIPT = f"""<script>
(() => {{
    const shown = async (url) => {{ const probe = new Image(); probe.src = url; await probe.decode(); return url; }};
    let latest = 0;  // an answer that comes after a later click's is not shown
    let pending = null;  // the quick answer under way: {{done, click}} (the click held back from Gradio)
    const release = (quick) => {{
        quick.done = true;
        if (quick.click) {{
            const held = quick.click;
            quick.click = null;
            held.target.dispatchEvent(new MouseEvent("click", {{bubbles: true, cancelable: true, view: window,
                clientX: held.clientX, clientY: held.clientY, screenX: held.screenX, screenY: held.screenY}}));
        }}
    }};
    document.addEventListener("click", (event) => {{
        if (!event.isTrusted || !pending || pending.done || !event.target.closest("#query-image button")) return;
        event.stopImmediatePropagation();
        pending.click = event;
    }}, {{capture: true}});
    document.addEventListener("pointerdown", async (event) => {{
        const button = event.target.closest && event.target.closest("#query-image button");
        const img = button && button.querySelector("img");
        const key = document.querySelector("#{SESSION_KEY_ID} [data-session]");
        if (event.button !== 0 || !img || !img.naturalWidth || !key) return;
        const box = img.getBoundingClientRect();
        const scale = Math.min(box.width / img.naturalWidth, box.height / img.naturalHeight, 1);
        // a click's coordinates are whole pixels (the pointer's fall in between): as Gradio's select event sees them
        const x = Math.round((Math.floor(event.clientX) - box.left - (box.width - img.naturalWidth * scale) / 2) / scale);
        const y = Math.round((Math.floor(event.clientY) - box.top - (box.height - img.naturalHeight * scale) / 2) / scale);
        if (x < 0 || x >= img.naturalWidth || y < 0 || y >= img.naturalHeight) return;
        const click = ++latest;
        if (pending) release(pending);
        const quick = pending = {{done: false, click: null}};
        setTimeout(() => release(quick), {HOLD_MS});
        const root = ((window.gradio_config && window.gradio_config.root) || location.origin).replace(/\\/$/, "") + "/";
        try {{
            const answer = await fetch(`${{root}}{ROUTE.lstrip("/")}?session=${{key.dataset.session}}&x=${{x}}&y=${{y}}`);
            if (answer.status === 200) {{
                const bytes = await answer.arrayBuffer();
                let at = 0;
                const urls = answer.headers.get("{PICTURES_HEADER}").split(",").filter(Boolean).map((entry) => {{
                    const [id, length] = entry.split(":");
                    const png = new Blob([bytes.slice(at, at += Number(length))], {{type: "image/png"}});
                    return [id, URL.createObjectURL(png)];
                }});
                await Promise.all(urls.map(([, url]) => shown(url)));  // all at once, each decoded: no half-new page
                if (click === latest) {{
                    for (const [id, url] of urls) {{
                        const target = document.querySelector(`#${{id}} img`);
                        if (target) target.src = url;
                    }}
                }}
                // the pictures stay on screen when their URLs go; Gradio's event soon shows the same files
                setTimeout(() => urls.forEach(([, url]) => URL.revokeObjectURL(url)), {HOLD_MS});
            }}
        }} catch (error) {{
            console.debug("vit-explorer: no quick answer to the click; Gradio's event answers it", error);
        }} finally {{
            // after the next frame is painted: Gradio's client, given the click, keeps the page busy for some 20 ms
            requestAnimationFrame(() => setTimeout(() => release(quick), 0));
        }}
    }}, {{capture: true}});
}})();
</script>"""
