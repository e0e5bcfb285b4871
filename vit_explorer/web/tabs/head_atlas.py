"""The Head atlas tab: what each head does across a folder of images (``vit-explorer atlas``), not the image at hand. A
layers × heads grid named by each head's first description (a model that reads text) or the answer it pushes up most,
coloured by how much it writes into the answers; a click on a head shows its descriptions, its figures, its statistics
and the images where it writes most, each with the patches the head writes from (where the atlas's model loads). The
atlas is loaded from the folder ``vit-explorer atlas`` wrote, or computed here over a folder of this machine with the
page's model; it stays through uploads: the tab's views follow its own events only."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gradio as gr
import numpy as np

from vit_explorer.core.images import load_image
from vit_explorer.core.targets import prompted
from vit_explorer.draw import files, pictures
from vit_explorer.draw.render import GridGeometry
from vit_explorer.errors import VitExplorerError
from vit_explorer.models import LoadedModel
from vit_explorer.run import answer_split, atlas
from vit_explorer.web.captions import atlas_head_text, atlas_summary
from vit_explorer.web.session import CACHE_TTL_S, Controls, ModelCache, Session, export_dir
from vit_explorer.web.tabs.base import Tab, Wiring, map_image, run_progress, user_errors


@dataclass(frozen=True)
class LoadedAtlas:
    """The atlas the tab shows (``files.atlas_record``), the grid as drawn (for clicks) and the head selected."""

    record: dict
    geometry: GridGeometry
    head: tuple[int, int]


def layout() -> dict:
    with gr.Row():
        folder = gr.Textbox("", label="Atlas folder", placeholder="a folder written by vit-explorer atlas, then Enter",
                            info="what each head does across a folder of images: vit-explorer atlas FOLDER --model M --out DIR",
                            elem_id="atlas-folder", scale=4)
        load = gr.Button("Load", size="sm", scale=1, elem_id="atlas-load")
    with gr.Row():
        source = gr.Textbox("", label="Or compute one here", placeholder="a folder of images on this machine",
                            info="the model above over the folder (one sub-folder per class gives labels and prompts); "
                                 "seconds for a few hundred images on the shipped models", elem_id="atlas-source", scale=4)
        compute = gr.Button("Compute", size="sm", scale=1, elem_id="atlas-compute")
    summary = gr.Markdown("", elem_id="atlas-summary")
    with gr.Row(equal_height=False):
        grid = map_image("atlas-grid", "Heads across the folder", scale=3)
        with gr.Column(scale=2, min_width=300):
            head = gr.Markdown("", elem_id="atlas-head")
            images = gr.Gallery(label="Where it writes most", columns=2, height=300, visible=False, elem_id="atlas-images")
    return {"atlas_folder": folder, "atlas_load": load, "atlas_source": source, "atlas_compute": compute,
            "atlas_summary": summary, "atlas_grid": grid, "atlas_head": head,
            "atlas_images": images, "atlas_state": gr.State(None)}


SHOWN = ("atlas_state", "atlas_summary", "atlas_grid", "atlas_head", "atlas_images")


def shown(models: ModelCache, record: dict, head: tuple[int, int]) -> tuple:
    """The tab's views of ``record`` with ``head`` selected (``SHOWN``): its top images with the patches it writes from,
    where the atlas's model loads here (one forward and backward pass each), else the images alone."""
    picture, geometry = pictures.atlas_picture(record, head)
    entry = record["heads"][head[0] * record["heads_per_layer"] + head[1]]
    model = atlas_model(models, record)
    gallery = gr.update(value=[top_image(model, path, rank, head) for rank, path in enumerate(entry["top_images"])],
                        visible=True)
    note = "" if model is not None else (f"\n\n(The atlas's model {record['model']} does not load here, so its top images "
                                         "are shown without the patches the head writes from.)")
    return (LoadedAtlas(record, geometry, head), atlas_summary(record), picture, atlas_head_text(record, entry) + note,
            gallery)


def atlas_model(models: ModelCache, record: dict) -> LoadedModel | None:
    """The model the atlas was made with, answering among its answers as it did (a text model: its prompts); None where
    it does not load here."""
    try:
        model = models.get(record.get("spec") or record["model"])
    except VitExplorerError:
        return None
    return prompted(model, "\n".join(record["answers"])) if model.text is not None else model


def top_image(model: LoadedModel | None, path: str, rank: int, head: tuple[int, int]) -> tuple[np.ndarray, str]:
    """One of a head's top images, small, with the patches the head writes from over it (red adds to the image's
    answer) where the model is at hand, its rank and name; grey where the image can no longer be read."""
    name = f"{rank + 1}. {Path(path).name}"
    try:
        if model is not None:
            analysis, split = answer_split(model, path)
            return pictures.head_split_thumbnail(analysis, split, *head, THUMBNAIL_PX), name
        image = load_image(path)
    except VitExplorerError:
        return np.full((THUMBNAIL_PX, THUMBNAIL_PX, 3), 200, np.uint8), f"{name} (unreadable now)"
    image.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX))
    return np.asarray(image.convert("RGB")), name


THUMBNAIL_PX = 160


@user_errors
def on_load(models: ModelCache, folder: str) -> tuple:
    """An atlas folder given: its grid, with the head that writes most into the answers selected."""
    record = files.read_atlas(folder.strip())
    strongest = max(record["heads"], key=lambda entry: entry["mean_abs_contribution"])
    return shown(models, record, (strongest["layer"], strongest["head"]))


@user_errors
def on_compute(models: ModelCache, spec: str, source: str, prompts: str, ttl_s: float = CACHE_TTL_S,
               progress: Callable | None = None) -> tuple:
    """An atlas of the page's model over a folder of this machine (``run.atlas``, a model that reads text answering
    among the page's prompts where there are any), written beside the app's exports and shown as a loaded one."""
    found = atlas(models.get(spec), source.strip(), prompts=[line for line in prompts.splitlines() if line.strip()] or None,
                  loads_as=spec, progress=run_progress(progress))
    out = export_dir(ttl_s) / f"atlas-{uuid.uuid4().hex[:12]}"
    files.write_atlas(found, out)
    return on_load(models, str(out))


def on_select(models: ModelCache, evt: gr.SelectData, loaded: LoadedAtlas | None) -> tuple:
    """A head clicked in the grid: its views; nothing on a label, the colour bar, or before an atlas is loaded."""
    hit = None if loaded is None else loaded.geometry.hit(evt.index[0], evt.index[1])
    if hit is None:
        return (loaded, *(gr.update() for _ in SHOWN[1:]))
    return shown(models, loaded.record, hit)


def wire(app: Wiring) -> None:
    outputs = app.all(SHOWN)

    def load(folder):
        return on_load(app.models, folder)

    def select(evt: gr.SelectData, loaded):
        return on_select(app.models, evt, loaded)

    app["atlas_folder"].submit(load, app["atlas_folder"], outputs, api_name="load_atlas")
    app["atlas_load"].click(load, app["atlas_folder"], outputs, api_name=False)
    app["atlas_grid"].select(select, app["atlas_state"], outputs, api_name="select_atlas_head")

    def compute(spec, source, prompts, progress=gr.Progress()):  # Gradio's bar there
        return on_compute(app.models, spec, source, prompts, ttl_s=app.cache_ttl_s, progress=progress)

    app["atlas_compute"].click(compute, [app["current_model"], app["atlas_source"], app["prompts"]], outputs,
                               api_name="compute_atlas", concurrency_limit=1, show_progress="full",
                               show_progress_on=[app["atlas_summary"]])  # one bar, not one over every view


def render(session: Session, controls: Controls) -> dict:
    return {}  # the atlas is not the image's: its own events draw it


def depends(session: Session, controls: Controls) -> tuple:
    return ()


TAB = Tab("Head atlas", (), layout, render, depends, wire)
