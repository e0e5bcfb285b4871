"""The Gradio app: the page's layout and its event wiring, and ``serve``. The tabs are modules of ``tabs``
(each builds its components, renders its views and wires its own events); the events every tab follows
are in ``tabs.shared``. Components and callbacks meet by name: ``CONTROL_NAMES`` for the controls,
``FULL_OUTPUTS`` and the other output tuples for what a callback fills.

The model runs once per (image, model); the resulting ``Analysis`` (CPU arrays, no model reference)
is the session's state, and every other control re-renders from it, only the tab that is open.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gradio as gr
from gradio.components.base import Component
from gradio.utils import get_upload_folder
from PIL import Image

from vit_explorer.core import maps
from vit_explorer.core.analysis import DEFAULT_MEMORY_BUDGET
from vit_explorer.core.register_neurons import RegisterNeurons
from vit_explorer.draw import render
from vit_explorer.errors import VitExplorerError
from vit_explorer.models import DEFAULT_MODEL, stage_specs
from vit_explorer.models.builtin import EXAMPLES
from vit_explorer.shapes.generator import example_class
from vit_explorer.web import quick_answer
from vit_explorer.web.quick_answer import SESSION_KEY_ID, QuickAnswers
from vit_explorer.web.session import CACHE_TTL_S, CONTROL_NAMES, INPUT_NAMES, Controls, ModelCache, model_choices
from vit_explorer.web.tabs import TABS
from vit_explorer.web.tabs.base import MAP_VIEW, Wiring
from vit_explorer.web.tabs.shared import (
    FIRST_TAB,
    FULL_OUTPUTS,
    QUERIED,
    TAB_OUTPUTS,
    TARGETED,
    controls_answers,
    on_model_change,
    on_patch_click,
    on_query_choice,
    on_query_token,
    on_reset_query,
    opening_answers,
    run_analysis,
    show_visible,
    target_answers,
)
from vit_explorer.web.upload import image_upload

TITLE = "vit_explorer"
INTRO = ("See what a Vision Transformer looks at: every head's attention, rollout, and the patches a class "
         "depends on. Click a patch to see where it looks.")
MAX_UPLOAD = "20mb"
# Gradio floats an image's buttons over its top-right corner, where they hid column labels and map corners:
# on our pictures they get a line of their own above the picture instead
# A dropdown's arrow is drawn over the right end of its text box: the text stops short of it (and ends in "…")
# While a quick answer is awaited the pictures dim, after 0.15 s (``quick_answer``)
# The tab buttons' padding narrowed from 16 px so that 14 tabs stay on two lines at 1280 px and the first screen holds
# the maps
WAITING = quick_answer.WAITING_CLASS
CSS = f""".{MAP_VIEW} .icon-button-wrapper {{ position: static; justify-content: flex-end; margin: 0 0 2px auto; }}
.secondary-wrap input {{ padding-right: 28px; text-overflow: ellipsis; min-width: 0; }}
#{SESSION_KEY_ID} {{ display: none; }}
.{WAITING} #query-image img, .{WAITING} .{MAP_VIEW} img {{ opacity: 0.5; transition: opacity 0.2s 0.15s; }}
.{WAITING} {{ cursor: progress; }}
button[role="tab"] {{ padding: 0 10px; }}"""
NORMALISATIONS = ("per tile", "shared")


def model_panel(model_spec: str, reads_text: bool, upload: gr.Image, stages: list[str] | None = None) -> dict:
    """Above the tabs: the model and its fit, folded once chosen (``wire``), and the summary under it; beside them the
    target, in sight from every tab, and the text prompts of a model with a text tower (``reads_text``), folded once
    submitted; under both the examples and the view controls side by side (an example goes to ``upload``). At 1280 × 800 a
    tab's content then starts in the
    upper half of the screen."""
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=300):
            with gr.Accordion("Model and fit", open=True, elem_id="model-panel") as model_panel, gr.Row():
                model = gr.Dropdown(model_choices(model_spec, stages), value=model_spec, allow_custom_value=True,
                                    label="Model", info="built-in, timm:NAME, hf:REPO or a checkpoint file; a Swin's "
                                                        "stages as SPEC#stage=K", scale=3)
                fit = gr.Radio([("stretch", "stretch"), ("pad to square", "pad")], value="stretch",
                               label="Fit to the model's input",
                               info="for images of other proportions", scale=2, min_width=220)
            summary = gr.Markdown("Upload an image to begin.", elem_id="summary")
        with gr.Column(scale=2, min_width=200):
            # in sight from every tab: the tabs that explain a class (class maps, ablation, compare) all follow this one
            target = gr.Dropdown([], label="Target class", interactive=False, elem_id="target")
            # a text model's prompts are its classes: under the target menu that chooses among them
            with gr.Accordion("Text prompts", open=True, visible=reads_text, elem_id="prompts-panel") as prompts_panel:
                prompts = gr.Textbox("", show_label=False, label="Text prompts", lines=2, max_lines=6, elem_id="prompts",
                                     placeholder="one prompt per line, e.g.\na photo of a dog\na photo of a cat",
                                     info=PROMPTS_INFO, submit_btn="Explain")
    with gr.Row(equal_height=False):
        # the shapes are what the built-in model knows; another model is offered no examples it would misread.
        # Open until an image is analysed, then folded, so that the maps come up on the first screen
        with gr.Column(min_width=300), gr.Accordion("Examples (generated shapes, for the built-in models)", open=True,
                                                    visible=shows_examples(model_spec), elem_id="examples") as examples:
            paths = sorted(EXAMPLES.glob("*.png"))
            shown = gr.Examples([str(path) for path in paths], inputs=upload, label=None) if paths else None
            gr.Markdown(hard_cases_note(paths), elem_id="hard-cases")
        with gr.Column(min_width=300):
            controls = view_controls()
    return {"model": model, "fit": fit, "target": target, "prompts": prompts, "summary": summary, "model_panel": model_panel,
            "prompts_panel": prompts_panel, "examples": examples, "example_images": shown, **controls}


PROMPTS_INFO = ("this model reads text: its prompts become its classes (a zero-shot prediction over them), and the target "
                "menu explains any of them; Explain (or Shift+Enter) analyses the image with them")


def reads_text(models: ModelCache, spec: str) -> bool:
    """Whether the model of ``spec`` has a text tower (one that cannot be loaded has none to offer)."""
    try:
        return models.get(spec).text is not None
    except VitExplorerError:
        return False


def stages_of(models: ModelCache, spec: str) -> list[str]:
    """The spec of each stage of the model of ``spec`` (``models.stage_specs``); none where it cannot be loaded."""
    try:
        return stage_specs(models.get(spec))
    except VitExplorerError:
        return []


def hard_cases_note(paths: list[Path]) -> str:
    """The line under the examples naming those the model gets wrong (``NN-class-hard-case.png``); empty if none."""
    hard = [(number, name) for number, (name, is_hard) in enumerate(map(example_class, paths), start=1) if is_hard]
    if not hard:
        return ""
    named = ", ".join(f"the {ordinal(number)} (a {name})" for number, name in hard)
    return (f"Hard case{'s' if len(hard) > 1 else ''}: {named}, which the model gets wrong; the maps show what its mistake "
            "looks at. The others it gets right.")


def ordinal(number: int) -> str:
    return f"{number}{'th' if 10 <= number % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(number % 10, 'th')}"


def shows_examples(model_spec: str) -> bool:
    """Whether the generated-shape examples are offered: for the built-in models (the shapes model and the
    shapes-CLIP) only."""
    return model_spec.startswith("builtin:")


def query_panel() -> dict:
    """The image as the model sees it (click a patch to make it the query), the query and the predictions."""
    gr.Markdown("**The image as the model sees it** — click a patch to make it the query")
    query_image = gr.Image(show_label=False, label="The image as the model sees it", interactive=False, format="png", buttons=[],
                           elem_id="query-image")
    caption = gr.Markdown("", elem_id="query-caption")
    # not shown: names the session to the page's script that answers a patch click or an upload at once (``quick_answer``)
    session_key = gr.HTML("", elem_id=SESSION_KEY_ID, padding=False)
    query = gr.Dropdown([], label="Query token", info="a prefix token, the mean of patch queries, or the clicked patch",
                        elem_id="query")
    reset = gr.Button("Back to class token", size="sm")
    top5 = gr.Label(num_top_classes=5, label="Top-5 predictions", elem_id="top5")
    return {"query_image": query_image, "caption": caption, "query": query, "reset": reset, "top5": top5,
            "session_key": session_key}


def view_controls() -> dict:
    """The controls every map follows: colormap, colour scale, overlay, grid normalisation and head order; folded
    under one line, so that the maps come up on the first screen."""
    with gr.Accordion("View: colours, overlay, grid, head order", open=False,
                      elem_id="view-controls"), gr.Row():
        cmap = gr.Dropdown(list(render.COLORMAPS), value="inferno", label="Colormap", min_width=110)
        colour_scale = gr.Dropdown([(name, key) for key, name in render.COLOUR_SCALES.items()], value="linear",
                                   label="Colour scale",
                                   min_width=170)
        overlay = gr.Checkbox(True, label="Overlay on image", min_width=110)
        normalisation = gr.Dropdown(list(NORMALISATIONS), value="per tile", label="Normalisation", min_width=130)
        order_by = gr.Dropdown(list(maps.ORDERINGS), value="none", label="Order heads by", min_width=140)
    return {"cmap": cmap, "colour_scale": colour_scale, "overlay": overlay, "normalisation": normalisation, "order_by": order_by}


def schema_once_per_data_model() -> None:
    """Gradio builds a new component for every output an event updates, even with nothing to change, and each new
    component asks pydantic for its data model's JSON schema again: about half of the 40 ms a patch click spent on its
    57 mostly unchanged outputs. The schema is the data model class's alone, so it is computed once per class (the
    components that compute their own keep doing so)."""
    if getattr(Component.api_info, "once_per_data_model", False):
        return
    per_instance = Component.api_info
    schemas: dict[type, dict] = {}

    def api_info(self: Component) -> dict:
        if self._api_info_cache is None and self.data_model is not None:
            if self.data_model not in schemas:
                schemas[self.data_model] = per_instance(self)
            self._api_info_cache = schemas[self.data_model]
        return per_instance(self)

    api_info.once_per_data_model = True  # type: ignore[attr-defined]
    Component.api_info = api_info  # type: ignore[method-assign]


def build_demo(model_spec: str = DEFAULT_MODEL, models: ModelCache | None = None, cache_ttl_s: int = CACHE_TTL_S) -> gr.Blocks:
    """The app's layout and wiring; ``model_spec`` is the model selected at start.

    Every rendered view is a file in Gradio's cache; files older than ``cache_ttl_s`` are deleted
    (checked every ``cache_ttl_s / 2`` seconds, at most every 10 minutes), and all of them when the
    server stops, so disk use is bounded by what one ``cache_ttl_s`` of use produces.
    """
    models = models or ModelCache()
    schema_once_per_data_model()
    with gr.Blocks(title=TITLE, delete_cache=(max(1, min(600, cache_ttl_s // 2)), cache_ttl_s)) as demo:
        ui: dict = {"state": gr.State(None, time_to_live=CACHE_TTL_S), "current_model": gr.State(model_spec),
                    "visible_tab": gr.State(FIRST_TAB)}
        gr.Markdown(f"**{TITLE}** · {INTRO}", elem_id="intro")
        # the image column beside the tabs: the upload, then the query image level with the grid and the maps that follow it
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=280):
                ui["upload"] = image_upload(sources=["upload", "clipboard"], label="Image (upload or paste)", height=160,
                                            elem_id="upload")
                ui.update(query_panel())
            with gr.Column(scale=5):
                ui.update(model_panel(model_spec, reads_text(models, model_spec), ui["upload"], stages_of(models, model_spec)))
                with gr.Tabs(overflow_behavior="wrap"):  # every tab in sight, in two rows on a narrow screen
                    containers = {}
                    for tab in TABS:
                        with gr.Tab(tab.title, elem_id=f"tab-{tab.slug}") as containers[tab.title]:
                            ui.update(tab.layout())
        answers = QuickAnswers(models)
        wire(Wiring(ui, models, cache_ttl_s), containers, answers)
    quick_answer.register(demo, ui, answers)
    return demo


def launch(demo: gr.Blocks, **options) -> None:
    """Launch the page ``build_demo`` made (``options``: ``gr.Blocks.launch``'s, never blocking) with its style, its script
    and the routes that answer a patch click or an upload at once (``quick_answer``)."""
    demo.launch(css=CSS, head=quick_answer.SCRIPT, prevent_thread_lock=True, **options)
    quick_answer.add_routes(demo)


# an image given while the last one is still being analysed is analysed after it (Gradio's default, "once", dropped it)
LATEST = "always_last"


def wire(app: Wiring, containers: dict, answers: QuickAnswers) -> None:
    """The events every tab follows, then each tab's own; the page's quick answers (``answers``) take part in the analysis
    events, and the tabs know nothing of them."""
    state, visible, current_model, upload = app["state"], app["visible_tab"], app["current_model"], app["upload"]
    controls = app.controls  # by name: a control without a component fails here

    # a generator: a dear model's first maps come before its evidence; each analysis names its session to the page's
    # script in the hidden ``session_key``, its last output
    analyse = answers.keyed(answers.analysis_event, FULL_OUTPUTS.index("state"))
    analysed = [*app.all(FULL_OUTPUTS), app["session_key"]]

    def model_change(spec, current, upload_path, session, tab, progress=gr.Progress(), *values):  # Gradio's bar there
        yield on_model_change(app.models, spec, current, upload_path, session, tab, *values, progress=progress)

    switch_model = answers.keyed(model_change, 2 + FULL_OUTPUTS.index("state"))

    # an upload (or a paste) analyses once: Gradio fires ``change`` twice when an image replaces another, which ran the
    # model twice per upload; an example sets the image without an upload event, so its own click analyses it.
    # The progress shows on the image and the summary, not as an overlay animated over all 71 outputs: drawing those
    # took the page's time and, on 2 cores, the model's
    progress_on = [app["query_image"], app["summary"]]
    analyses = (
        upload.upload(analyse, [upload, current_model, visible, *controls], analysed, api_name="analyze",
                      concurrency_limit=2, show_progress="full", show_progress_on=progress_on, trigger_mode=LATEST),
        app["fit"].input(analyse, [upload, current_model, visible, *controls], analysed, api_name="set_fit",
                         concurrency_limit=2, show_progress_on=progress_on),
        app["model"].input(switch_model, [app["model"], current_model, upload, state, visible, *controls],
                           [current_model, app["model"], *analysed], api_name="change_model", concurrency_limit=2),
        app["prompts"].submit(analyse, [upload, current_model, visible, *controls], analysed, api_name="set_prompts",
                              concurrency_limit=2, show_progress_on=progress_on),
    )
    analyses[2].then(lambda spec: (gr.update(visible=shows_examples(spec)), gr.update(visible=reads_text(app.models, spec))),
                     current_model, [app["examples"], app["prompts_panel"]], api_name=False, show_progress="hidden")
    upload.clear(analyse, [upload, current_model, visible, *controls], analysed, api_name=False)  # empties the views
    if app["example_images"] is not None:
        analyses += (app["example_images"].load_input_event.then(
            analyse, [upload, current_model, visible, *controls], analysed, api_name="analyze_example",
            concurrency_limit=2, show_progress="full", show_progress_on=progress_on, trigger_mode=LATEST),)
    # once an image is analysed the panels above the tabs fold, so that the maps come up on the first screen: the model
    # panel after any analysis, the examples after an image, the prompts once submitted
    for event in analyses:
        folded = [app["model_panel"], *([app["examples"]] if event is not analyses[2] else []),
                  *([app["prompts_panel"]] if event is analyses[3] else [])]
        event.then(folding(len(folded)), None, folded, api_name=False, show_progress="hidden")
    for event, name in zip(analyses, ("analyze", "set_fit", "change_model", "set_prompts", "analyze_example"), strict=True):
        # a tab opened while the model ran was drawn from the previous analysis, or not at all: draw it now
        event.success(show_visible, [state, visible, *controls], app.all(TAB_OUTPUTS), api_name=f"{name}_open_tab",
                      show_progress="hidden")

    wire_query(app)

    def choose_target(session, target, tab, *values):  # a generator: a map that waits for the pass is cleared first
        yield from target_answers(app.models, session, target, tab, *values)

    app["target"].input(choose_target, [state, app["target"], visible, *controls], app.all(TARGETED), api_name="set_target",
                        concurrency_limit=2)
    for name in CONTROL_NAMES:
        component = app[name]
        # the fit and the prompts change the model's input: they analyse again, above; a state is set by its own tab's events
        if name not in INPUT_NAMES and not isinstance(component, gr.State):
            # a text box answers once its text is submitted, not at every key
            event = component.submit if isinstance(component, gr.Textbox) else component.input
            event(controls_answers, [state, visible, *controls], app.all(TAB_OUTPUTS),
                  api_name=f"set_{component.label.lower().replace(' ', '_')}")
    for tab in TABS:
        containers[tab.title].select(opening_answers(tab), [state, *controls], [visible, *app.all(tab.outputs)],
                                     api_name=f"open_{tab.slug}")
        if tab.wire is not None:
            tab.wire(app)


def wire_query(app: Wiring) -> None:
    """The events that choose the query: a patch clicked on the image, a query point clicked in the Queries and keys tab,
    the query dropdown and its reset."""
    state, visible, controls = app["state"], app["visible_tab"], app.controls

    def select_patch(evt: gr.SelectData, session, tab, *values):
        return on_patch_click(app.models, evt, session, tab, *values)

    def select_token(evt: gr.SelectData, session, tab, *values):
        return on_query_token(app.models, evt, session, tab, *values)

    # no loading overlay over every view for an answer that takes a tenth of a second: drawing it cost the page's time
    app["query_image"].select(select_patch, [state, visible, *controls], app.all(QUERIED), api_name="select_patch",
                              show_progress="hidden")
    app["qk_plot"].select(select_token, [state, visible, *controls], app.all(QUERIED), api_name="select_query_token",
                          show_progress="hidden")
    app["query"].input(on_query_choice, [state, app["query"], visible, *controls], app.all(QUERIED), api_name="select_query")
    app["reset"].click(on_reset_query, [state, visible, *controls], app.all(QUERIED), api_name="reset_query")


def folding(count: int) -> Callable[[], Any]:
    """An event's callback that folds ``count`` accordions."""
    return lambda: gr.update(open=False) if count == 1 else tuple(gr.update(open=False) for _ in range(count))


SHARE_WARNING = ("vit-explorer: warning: --share opens a public Gradio link: anyone with it can use this app, upload files to "
                 "this machine and run the model here")


def serve(model_spec: str = DEFAULT_MODEL, host: str = "127.0.0.1", port: int = 7860, share: bool = False,
          open_browser: bool = True,
          memory_budget: int = DEFAULT_MEMORY_BUDGET, cache_ttl_s: int = CACHE_TTL_S,
          input_hw: tuple[int, int] | None = None, registers: str | Path | None = None) -> None:
    """Load ``model_spec`` (failing early with a message if it cannot be), then serve the app; ``input_hw``
    sets every model's input size where the model allows it; ``registers`` (a file of ``vit-explorer registers`` for
    this model) fills the Test-time register tab."""
    check_port(host, port)
    neurons = RegisterNeurons.read(registers) if registers is not None else None
    models = ModelCache(memory_budget=memory_budget, input_hw=input_hw, registers=neurons)
    model = models.get(model_spec)
    if neurons is not None and neurons.model != model.name:
        raise VitExplorerError(f"{registers}: calibrated for {neurons.model}, not {model.name}: run `vit-explorer registers "
                               f"FOLDER --model {model_spec}`")
    if share:
        print(SHARE_WARNING, file=sys.stderr, flush=True)
    demo = build_demo(model_spec, models, cache_ttl_s)
    demo.queue(default_concurrency_limit=4)
    launch(demo, server_name=host, server_port=port, share=share, inbrowser=open_browser, max_file_size=MAX_UPLOAD,
           allowed_paths=[str(EXAMPLES)] if EXAMPLES.is_dir() else None, footer_links=["api"], theme=gr.themes.Soft(), quiet=True)
    print(serving_line(model_spec, host, demo.server_port, demo.share_url), file=sys.stderr, flush=True)
    threading.Thread(target=warm_up, args=(models, model_spec), daemon=True, name="warm-up").start()
    try:
        demo.block_thread()
    except KeyboardInterrupt:
        demo.close()


def warm_up(models: ModelCache, spec: str) -> None:
    """The upload handler run once on a grey picture, as for a user's upload (the maps, the top class's gradients, the
    decomposition, the shared views and the first tab drawn, their pictures written), so that the user's first upload
    does not pay what a model's and the drawing's first run cost: the math library's start, the allocator's first
    pages, the decomposition's pass with its maps at zero (what it saves: docs/figures.md, "Warming up"). Run beside the
    server, which serves meanwhile: an upload that comes first waits for it on the model's lock."""
    with tempfile.TemporaryDirectory() as folder:
        grey = Path(folder) / "grey.png"
        Image.new("RGB", models.get(spec).preprocess.input_hw[::-1], (128, 128, 128)).save(grey)
        outputs = run_analysis(models, str(grey), spec, FIRST_TAB, *Controls().values())
    # its pictures went to Gradio's cache but never through an event, so Gradio would never delete them
    cache = Path(get_upload_folder()).resolve()
    for value in outputs:
        path = value.get("value") if isinstance(value, dict) else value
        if isinstance(path, str) and Path(path).resolve().is_relative_to(cache):
            Path(path).unlink(missing_ok=True)


def check_port(host: str, port: int) -> None:
    """A port another program listens on is a one-line error naming a free one, before the model loads (Gradio
    would print a long traceback about GRADIO_SERVER_PORT)."""
    import socket

    def free(candidate: int) -> bool:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, candidate))
            except OSError:
                return False
            return True

    if free(port):
        return
    spare = next((candidate for candidate in range(port + 1, port + 50) if free(candidate)), None)
    hint = f"; try --port {spare}" if spare is not None else ""
    raise VitExplorerError(f"port {port} is in use on {host}{hint}")


def serving_line(model_spec: str, host: str, port: int, share_url: str | None) -> str:
    """The one line ``serve`` prints: where the app is, who can reach it, and how to stop it."""
    local = host in ("127.0.0.1", "localhost", "::1")
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    reach = "this machine only" if local else f"other machines that can reach {host} too"
    if share_url:
        reach += f", and anyone with the public link {share_url}"
    return f"vit-explorer: serving {model_spec} at http://{shown}:{port} ({reach}); press Ctrl+C to stop"
