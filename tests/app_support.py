"""What the tests of the app's callbacks share: the tabs by title, the controls, and helpers that call an event
and read its outputs by name."""

from pathlib import Path

import gradio as gr
import numpy as np
from PIL import Image

from vit_explorer.web.session import Controls
from vit_explorer.web.tabs import shared

# by title, so that a tab added to ``TABS`` leaves these tests as they are
OVERVIEW, GRID, ROLLOUT, CLASS_MAPS, STATISTICS, ABLATION, NORMS, EXPORT = (
    "Overview", "Layers × heads", "Rollout", "Class maps", "Head statistics", "Head ablation", "Token norms", "Export")


def controls(**changes) -> tuple:
    """Control values in ``CONTROL_NAMES`` order, as the app passes them."""
    return Controls.named(**changes).values()


CONTROLS = controls()


def forward_counter(models, spec):
    calls = []
    models.get(spec).module.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def hidden(update) -> bool:
    """A chart sent empty and hidden (no empty box on the page)."""
    return update["value"] is None and update["visible"] is False


def click(x, y):
    return gr.SelectData(None, {"index": [x, y], "value": None, "selected": True})


def by_name(outputs: tuple, names: tuple) -> dict:
    assert len(outputs) == len(names)
    return {name: read_back(value) for name, value in zip(names, outputs, strict=True)}


def read_back(value):
    """A picture an event handed to Gradio as a file (``base.as_file``), read back as the array it was drawn from."""
    if isinstance(value, str) and value.endswith(".png") and Path(value).is_file():
        return np.asarray(Image.open(value).convert("RGB"))
    if isinstance(value, dict) and isinstance(value.get("value"), str):
        return {**value, "value": read_back(value["value"])}
    return value


def analysed(models, upload, checkpoint, visible=OVERVIEW):
    outputs = by_name(shared.run_analysis(models, upload, checkpoint, visible, *CONTROLS), shared.FULL_OUTPUTS)
    return outputs["state"], outputs


def opened(tab_title, session, values=CONTROLS) -> dict:
    """Open a tab: the outputs it sends, by name (the tabs the app's events use, see ``draws``)."""
    tab = next(tab for tab in shared.TABS if tab.title == tab_title)
    title, *outputs = shared.opener(tab)(session, *values)
    assert title == tab_title
    return by_name(tuple(outputs), tab.outputs)


def is_unchanged(value) -> bool:
    return value == gr.update()


def colour_bar_ends(picture: np.ndarray, geometry) -> tuple[np.ndarray, np.ndarray]:
    """The colours at the two ends of a heat map's colour bar (the row below the tiles with the most strongly coloured
    pixels)."""
    bar = picture[geometry.size_hw[0]:].astype(int)
    strong = np.abs(bar[..., 0] - bar[..., 2]) > 60  # clearly red or clearly blue
    row = int(strong.sum(axis=1).argmax())
    columns = np.flatnonzero(strong[row])
    return bar[row, columns[0]], bar[row, columns[-1]]


def tile_colour(picture: np.ndarray, geometry, layer: int, head: int) -> np.ndarray:
    """The colour near a heat-map tile's corner, clear of its centred value and of an outline."""
    y, x = geometry.tile_origin(layer, head)
    return picture[y + 4, x + 4].astype(int)


def analysed_model(model, name: str, upload: Path):
    """The session and outputs of ``upload`` analysed in the app with ``model`` (built in the test), cached as ``name``."""
    from vit_explorer.web.session import ModelCache

    models = ModelCache()
    models.put(name, model)
    return (models, *analysed(models, str(upload), name))


def open_every_tab(session, refused: dict[str, str]) -> None:
    """Open every tab on ``session``: each sends all its outputs, except the tabs in ``refused``, which say why they
    cannot (a ``gr.Error`` whose message matches the pattern given)."""
    import re

    from vit_explorer.web.tabs import TABS

    for tab in TABS:
        if tab.title in refused:
            try:
                opened(tab.title, session)
            except gr.Error as error:
                assert re.search(refused[tab.title], str(error)), (tab.title, str(error))
            else:
                raise AssertionError(f"{tab.title} opened instead of saying why it cannot")
        else:
            views = opened(tab.title, session)  # a tab that fails raises here
            assert set(views) == set(tab.outputs), tab.title
