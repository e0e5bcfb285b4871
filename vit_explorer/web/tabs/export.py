"""The Export tab: a zip of what ``vit-explorer analyze`` writes, for the current query and options, plus the
selected head's view and the class-maps tab's map."""

from __future__ import annotations

import tempfile
import uuid
import zipfile
from pathlib import Path

import gradio as gr

from vit_explorer import run
from vit_explorer.core import maps
from vit_explorer.core.maps import CLASS_METHODS
from vit_explorer.core.request import Request
from vit_explorer.draw import files
from vit_explorer.web.captions import head_label
from vit_explorer.web.session import CACHE_TTL_S, Controls, Session, export_dir
from vit_explorer.web.tabs import class_maps
from vit_explorer.web.tabs.base import Tab, Wiring, require, user_errors
from vit_explorer.web.tabs.class_maps import check_key, render_class, score_key, shown, shown_method
from vit_explorer.web.tabs.layers_heads import render_head


def layout() -> dict:
    gr.Markdown("A zip with `attention.npz` (raw maps), `rollout.png`, `heads.png` and the selected head's view, "
                "for the current query and options — the same files `vit-explorer analyze` writes.")
    full_maps = gr.Checkbox(label="Every head's full map in attention.npz", value=False, elem_id="export-full-maps")
    note = gr.Markdown(elem_id="export-note")
    with gr.Row():
        button = gr.Button("Export", elem_id="export")
        report = gr.Button("Report (one HTML file to share)", elem_id="export-report")
    return {"export_full_maps": full_maps, "export_note": note, "export_button": button, "export_report": report,
            "export_file": gr.File(label="Download", interactive=False, elem_id="export-file")}


def size_note(session: Session) -> str:
    """What attention.npz will hold, and the size every head's full map adds, said before anything is written."""
    analysis = session.analysis
    if not analysis.store.full_bytes:
        return ("`attention.npz` holds the compact form (head means, prefix rows, statistics): this analysis kept no full maps, "
                "which were above the memory budget.")
    return (f"`attention.npz` holds the compact form (head means, prefix rows, statistics); every head's full map adds "
            f"{files.megabytes(analysis.store.full_bytes)} before zip compression.")


def render(session: Session, controls: Controls) -> dict:
    # a zip is made on request; none is left from another analysis
    return {"export_file": None, "export_note": size_note(session),
            "export_full_maps": gr.update(value=False, interactive=session.analysis.store.full_bytes > 0)}


def depends(session: Session, controls: Controls) -> tuple:
    return ()


@user_errors
def on_export(session: Session | None, full_maps: bool, *control_values, ttl_s: float = CACHE_TTL_S) -> str:
    """The path of a new zip in ``export_dir``, removed after ``ttl_s``; ``full_maps`` adds every head's full map
    to ``attention.npz``."""
    session = require(session)
    controls = Controls.from_values(control_values)
    class_maps.prepare(session, controls)  # the class map in the zip is the tab's, AttnLRP and LeGrad included
    with tempfile.TemporaryDirectory() as staging:
        folder = Path(staging)
        rollout = maps.rollout_map(session.analysis, session.query, controls.rollout)
        heads = maps.heads_view(session.analysis, session.query, controls.order_by, session.evidence)
        shared = controls.normalisation == "shared"
        written, _ = files.write_views(session.analysis, rollout, heads, folder, cmap=controls.cmap, shared=shared,
                                       scale=controls.colour_scale, full_maps=full_maps)
        extra = {f"layer{session.layer}_{head_label(session.head).replace(' ', '_')}.png": render_head(session, controls),
                 f"{shown_method(session, controls)}.png": render_class(session, controls)}
        for name, picture in extra.items():
            if picture is not None:
                written.append(folder / name)
                files.save_png(picture, str(written[-1]))
        archive = export_dir(ttl_s) / f"vit-explorer-{uuid.uuid4().hex[:12]}.zip"
        with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
            for path in written:
                bundle.write(path, path.name)
    return str(archive)


@user_errors
def on_report(session: Session | None, *control_values, ttl_s: float = CACHE_TTL_S) -> str:
    """The path of a new ``report.html`` of this session in ``export_dir``: the analysis, its class maps for the target,
    and the faithfulness score, sanity check and head ablation where they ran on it."""
    session = require(session)
    controls = Controls.from_values(control_values)
    # only what the page shows for this target and these options: a score, sanity check or scoreboard made for another
    # target (the session keeps the last of each) would be shown under this target's name
    curves = shown(class_maps.view(session).score, score_key(session, controls))
    sanity = shown(class_maps.view(session).sanity, check_key(session, controls))
    board = shown(class_maps.view(session).board, check_key(session, controls))
    ablation = None if session.target is None else run.kept_ablation(session.analysis, session.target, controls.ablation_mode)
    # the report shows every class map: AttnLRP's and LeGrad's are computed now, once, if they have not been
    evidence = (None if session.evidence is None
                else run.evidence(session.model(), session.analysis, session.evidence.target, CLASS_METHODS))
    # a score shown is the chosen method's (``score_key``)
    request = Request(method=controls.method, options=controls.rollout, every_map=True, norms=True, overview=True)
    shown_run = run.answer(request, session.analysis, evidence, curves=curves, scoreboard=board, sanity=sanity,
                           ablation=ablation)
    folder = export_dir(ttl_s) / f"vit-explorer-report-{uuid.uuid4().hex[:12]}"
    folder.mkdir()
    return str(files.write_report(shown_run, folder, controls.cmap))


def wire(app: Wiring) -> None:
    def export_zip(session, full_maps, *values):
        return on_export(session, full_maps, *values, ttl_s=app.cache_ttl_s)

    app["export_button"].click(export_zip, [app["state"], app["export_full_maps"], *app.controls], app["export_file"],
                               api_name="export")

    def share_report(session, *values):
        return on_report(session, *values, ttl_s=app.cache_ttl_s)

    app["export_report"].click(share_report, [app["state"], *app.controls], app["export_file"], api_name="report")


TAB = Tab("Export", ("export_file", "export_note", "export_full_maps"), layout, render, depends, wire)
