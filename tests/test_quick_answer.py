"""Quick answers (``web.quick_answer``): a patch click's draws what the click's Gradio event then sends, and an upload's
analysis is the one the upload's event shows; neither event does the work again, model work a click's views need is
left to the event, and the routes serve the pictures in one answer."""

import io
import re
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import CLI_MODEL, photo, write_checkpoint
from PIL import Image

from vit_explorer.draw import pictures
from vit_explorer.web import app, quick_answer
from vit_explorer.web.quick_answer import QuickAnswers
from vit_explorer.web.session import Controls, ModelCache
from vit_explorer.web.tabs import layers_heads, overview, shared

GRID, OVERVIEW, CLASS_MAPS = "Layers × heads", "Overview", "Class maps"
CONTROLS = Controls().values()


@pytest.fixture
def checkpoint(tmp_path):
    return str(write_checkpoint(tmp_path / "six.safetensors", CLI_MODEL))


@pytest.fixture
def upload(tmp_path):
    path = tmp_path / "upload.png"
    photo((300, 200), seed=5).save(path)
    return str(path)


def by_name(values: tuple, names: tuple) -> dict:
    return dict(zip(names, values, strict=True))


def click(x: int, y: int):
    import gradio as gr

    return gr.SelectData(None, {"index": [x, y], "value": None, "selected": True})


def key_of(answers: QuickAnswers, session) -> str:
    """The key the page's hidden element names ``session`` by, as an analysis event writes it."""
    return re.search(r'data-session="([^"]+)"', answers.key_html(session)).group(1)


def pixels(path: str) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def test_the_click_event_sends_the_files_the_quick_answer_drew_and_draws_nothing_again(checkpoint, upload, monkeypatch):
    models = ModelCache()
    session = by_name(shared.run_analysis(models, upload, checkpoint, GRID, *CONTROLS), shared.FULL_OUTPUTS)["state"]
    answers = QuickAnswers(models)
    assert answers.sessions[key_of(answers, session)] is session and key_of(answers, session) == key_of(answers, session)
    assert key_of(QuickAnswers(models), session) != key_of(answers, session)  # each page names its sessions its own way
    height, width = pictures.view_hw(session.analysis)
    x, y = width - 3, height // 2
    quick = quick_answer.quick_views(session, x, y)
    token = pictures.token_at(session.analysis, x, y, (height, width))
    assert session.query != token  # the quick answer does not make the query the session's: the event does

    # the same views drawn independently: a fresh analysis's session with that query, through the tab's own render
    fresh = by_name(shared.run_analysis(models, upload, checkpoint, GRID, *CONTROLS), shared.FULL_OUTPUTS)["state"]
    fresh.query = token
    expected = layers_heads.TAB.render(fresh, Controls())
    np.testing.assert_array_equal(pixels(quick["grid"]), expected["grid"])
    np.testing.assert_array_equal(pixels(quick["head_view"]), expected["head_view"])
    np.testing.assert_array_equal(pixels(quick["query_image"]), pictures.image_picture(session.analysis, token))
    assert quick["grid_caption"] == expected["grid_caption"]

    drawn = []
    monkeypatch.setattr(pictures, "grid_picture", lambda *a, **k: drawn.append(1))
    event = by_name(shared.on_patch_click(models, click(x, y), session, GRID, *CONTROLS), shared.QUERIED)
    assert not drawn  # taken, not drawn again
    assert session.query == token
    for name in ("query_image", "grid", "head_view"):
        assert event[name] == quick[name], name  # the same file: the page's component holds what the page shows


def test_a_quick_answer_for_another_patch_is_not_what_a_later_event_sends(checkpoint, upload):
    """Quick answers may come without their event (a click held longer than the script waits, a press dragged away):
    the event of another patch draws its own views."""
    models = ModelCache()
    session = by_name(shared.run_analysis(models, upload, checkpoint, OVERVIEW, *CONTROLS), shared.FULL_OUTPUTS)["state"]
    height, width = pictures.view_hw(session.analysis)
    first = quick_answer.quick_views(session, 2, 2)
    event = by_name(shared.on_patch_click(models, click(width - 2, height - 2), session, OVERVIEW, *CONTROLS), shared.QUERIED)
    assert event["overview_rollout"] != first["overview_rollout"]
    last = pictures.token_at(session.analysis, width - 2, height - 2, (height, width))
    fresh = by_name(shared.run_analysis(models, upload, checkpoint, OVERVIEW, *CONTROLS), shared.FULL_OUTPUTS)["state"]
    fresh.query = last
    expected = overview.TAB.render(fresh, Controls())
    for name in ("overview_rollout", "overview_last"):
        np.testing.assert_array_equal(pixels(event[name]), expected[name])


def test_the_quick_answer_leaves_model_work_and_views_that_do_not_follow_the_query_to_the_event(checkpoint, upload,
                                                                                                 maps_only):
    # compact (a family that records no queries and keys): a clicked patch's rows need the model
    models = ModelCache(memory_budget=1)
    session = by_name(shared.run_analysis(models, upload, checkpoint, GRID, *CONTROLS), shared.FULL_OUTPUTS)["state"]
    height, width = pictures.view_hw(session.analysis)
    assert not session.analysis.store.keeps_rows_of(pictures.token_at(session.analysis, 5, 5, (height, width)))
    assert set(quick_answer.quick_views(session, 5, 5)) == {"query_image"}

    session = by_name(shared.run_analysis(ModelCache(), upload, checkpoint, CLASS_MAPS, *CONTROLS), shared.FULL_OUTPUTS)["state"]
    assert session.screen.open_tab == CLASS_MAPS
    assert set(quick_answer.quick_views(session, 5, 5)) == {"query_image"}


def test_the_route_serves_the_pictures_in_one_answer(checkpoint, upload):
    from serving import free_port

    models = ModelCache()
    demo = app.build_demo(checkpoint, models)
    demo.queue()
    port = free_port()
    app.launch(demo, server_name="127.0.0.1", server_port=port, quiet=True)
    try:
        session = by_name(shared.run_analysis(models, upload, checkpoint, GRID, *CONTROLS), shared.FULL_OUTPUTS)["state"]
        key = key_of(quick_answer.PAGES[demo], session)
        route = f"http://127.0.0.1:{port}{quick_answer.CLICK_ROUTE}"
        with urllib.request.urlopen(f"{route}?session={key}&x=7&y=9") as answer:
            layout = [entry.split(":") for entry in answer.headers[quick_answer.PICTURES_HEADER].split(",")]
            body = answer.read()
        with urllib.request.urlopen(f"{route}?session=not-a-session&x=7&y=9") as unknown:
            assert unknown.status == 204
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{route}?session={key}&x=seven&y=9")
    finally:
        demo.close()
    assert sum(int(length) for _, length in layout) == len(body)
    quick = quick_answer.quick_views(session, 7, 9)  # drawn again: the same files
    names = {"query-image": "query_image", "grid": "grid", "head-view": "head_view"}
    assert [elem_id for elem_id, _ in layout] == list(names)
    at = 0
    for elem_id, length in layout:
        picture = np.asarray(Image.open(io.BytesIO(body[at:at + int(length)])).convert("RGB"))
        at += int(length)
        np.testing.assert_array_equal(picture, pixels(quick[names[elem_id]]))


def analysed(answers: QuickAnswers, upload: str | None, spec: str, tab: str, control_values: tuple = CONTROLS) -> dict:
    """The outputs an upload's event (as the app wires it: ``keyed``) ends with, by name, the session key last."""
    *_, last = answers.keyed(answers.analysis_event, 0)(upload, spec, tab, *control_values)
    return by_name(last, (*shared.FULL_OUTPUTS, "session_key"))


def test_the_page_holds_the_session_key_only_after_an_analysis(checkpoint, upload):
    answers = QuickAnswers(ModelCache())
    assert analysed(answers, None, checkpoint, OVERVIEW)["session_key"] == ""
    outputs = analysed(answers, upload, checkpoint, OVERVIEW)
    key = key_of(answers, outputs["state"])
    assert outputs["session_key"] == f'<span data-session="{key}" data-uploads-ahead="1"></span>'
    assert answers.sessions[key] is outputs["state"]


def forward_counter(models: ModelCache, spec: str) -> list:
    calls: list = []
    models.get(spec).module.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def test_the_upload_event_shows_the_analysis_its_quick_answer_made_and_runs_no_pass(checkpoint, upload, tmp_path):
    models = ModelCache()
    answers = QuickAnswers(models)
    previous = analysed(answers, upload, checkpoint, GRID)["state"]
    image = tmp_path / "next.png"
    photo((200, 300), seed=8).save(image)
    passes = forward_counter(models, checkpoint)
    quick = answers.uploaded_views(previous, "next.png", image.read_bytes())
    ahead_passes = len(passes)
    assert ahead_passes > 0 and set(quick) == {"query_image", "grid", "head_view", "grid_caption"}
    ((_, ahead),) = answers.kept.values()

    event = analysed(answers, str(image), checkpoint, GRID)  # Gradio's copy of the file
    assert len(passes) == ahead_passes and event["state"] is ahead and not answers.kept
    for name in ("query_image", "grid", "head_view"):
        assert event[name] == quick[name], name

    # the same image analysed by the event alone: the same pictures, the same number of passes
    passes.clear()
    alone = analysed(answers, str(image), checkpoint, GRID)
    assert len(passes) == ahead_passes and alone["state"] is not ahead
    for name in ("query_image", "grid", "head_view"):
        np.testing.assert_array_equal(pixels(alone[name]), pixels(quick[name]))


def test_an_upload_with_other_inputs_or_a_staged_model_or_a_bad_file_is_left_to_the_event(checkpoint, upload, tmp_path,
                                                                                         monkeypatch):
    models = ModelCache()
    answers = QuickAnswers(models)
    previous = analysed(answers, upload, checkpoint, OVERVIEW)["state"]
    image = tmp_path / "next.png"
    photo((200, 300), seed=9).save(image)
    assert answers.uploaded_views(previous, "next.png", b"not an image") == {}
    cache = tmp_path / "cache" / "inner"
    monkeypatch.setattr(quick_answer, "get_upload_folder", lambda: str(cache))
    for name in ("..", "../../escape.png", str(tmp_path / "outside.png")):  # only ever a file in its own folder of the cache
        assert answers.uploaded_views(previous, name, b"not an image") == {}
    written = [path for path in tmp_path.rglob("*") if path.is_file() and b"not an image" in path.read_bytes()]
    assert written and all(path.parent.parent == cache for path in written), written
    answers.uploaded_views(previous, "next.png", image.read_bytes())
    padded = Controls.named(fit="pad").values()  # the fit changed since: another analysis
    event = analysed(answers, str(image), checkpoint, OVERVIEW, padded)
    assert "padded" in event["state"].analysis.view_note and len(answers.kept) == 1  # the one made ahead stays unused
    answers.kept.clear()

    monkeypatch.setattr(shared, "STAGED_FLOPS", 0)  # a dear classifier's upload answers in stages through its event
    assert answers.uploaded_views(previous, "next.png", image.read_bytes()) == {} and not answers.kept
    staged = analysed(answers, upload, checkpoint, OVERVIEW)
    assert 'data-uploads-ahead="0"' in staged["session_key"]  # the page's script does not hold the file back


def test_the_upload_route_analyses_the_posted_file(checkpoint, upload, tmp_path):
    from serving import free_port

    models = ModelCache()
    demo = app.build_demo(checkpoint, models)
    demo.queue()
    port = free_port()
    app.launch(demo, server_name="127.0.0.1", server_port=port, quiet=True)
    image = tmp_path / "next.png"
    photo((200, 300), seed=10).save(image)
    answers = quick_answer.PAGES[demo]
    try:
        previous = analysed(answers, upload, checkpoint, OVERVIEW)["state"]
        route = f"http://127.0.0.1:{port}{quick_answer.UPLOAD_ROUTE}"
        posted = urllib.request.Request(f"{route}?session={key_of(answers, previous)}&name=next.png", data=image.read_bytes(),
                                        method="POST")
        with urllib.request.urlopen(posted) as answer:
            layout = [entry.split(":") for entry in answer.headers[quick_answer.PICTURES_HEADER].split(",")]
            body = answer.read()
        unknown = urllib.request.Request(f"{route}?session=nobody&name=next.png", data=image.read_bytes(), method="POST")
        with urllib.request.urlopen(unknown) as answer:
            assert answer.status == 204
    finally:
        demo.close()
    assert [elem_id for elem_id, _ in layout] == ["query-image", "overview-rollout", "overview-last"]
    event = by_name(shared.run_analysis(models, str(image), checkpoint, OVERVIEW, *CONTROLS), shared.FULL_OUTPUTS)
    at = 0
    for (_, length), name in zip(layout, ("query_image", "overview_rollout", "overview_last"), strict=True):
        picture = np.asarray(Image.open(io.BytesIO(body[at:at + int(length)])).convert("RGB"))
        at += int(length)
        np.testing.assert_array_equal(picture, pixels(event[name]))


def test_answers_ahead_are_few_and_short_lived(checkpoint, upload, tmp_path, monkeypatch):
    """An answer whose event never came holds all of an image's maps: at most ``KEPT_UPLOADS``, none past ``KEPT_TTL_S``."""
    models = ModelCache()
    answers = QuickAnswers(models)
    previous = analysed(answers, upload, checkpoint, OVERVIEW)["state"]
    images = []
    for seed in range(quick_answer.KEPT_UPLOADS + 1):
        images.append(tmp_path / f"image-{seed}.png")
        photo((64, 64), seed=seed).save(images[-1])
        answers.uploaded_views(previous, images[-1].name, images[-1].read_bytes())
    assert len(answers.kept) == quick_answer.KEPT_UPLOADS
    assert answers.take(str(images[0]), checkpoint, Controls()) is None  # the oldest went
    assert answers.take(str(images[-1]), checkpoint, Controls()) is not None
    monkeypatch.setattr(quick_answer, "KEPT_TTL_S", 0.0)
    assert answers.take(str(images[1]), checkpoint, Controls()) is None  # too old to be taken


def test_a_tile_click_is_drawn_ahead_and_the_tile_event_sends_the_same_files(checkpoint, upload, monkeypatch):
    """Clicking through heads: a tile of the layers × heads grid selects its head in the quick answer as in the tile's
    event, which then draws nothing again; a label, or another open tab, has no quick answer."""
    models = ModelCache()
    session = by_name(shared.run_analysis(models, upload, checkpoint, GRID, *CONTROLS), shared.FULL_OUTPUTS)["state"]
    y, x = layers_heads.view(session).geometry.tile_origin(2, 1)
    at = (x + layers_heads.view(session).geometry.tile // 2, y + layers_heads.view(session).geometry.tile // 2)
    quick = quick_answer.tile_views(session, *at)
    assert set(quick) == set(layers_heads.OUTPUTS) and (session.layer, session.head) != (2, 1)
    assert "layer 2, head h1" in quick["grid_caption"]
    drawn = []
    monkeypatch.setattr(pictures, "grid_picture", lambda *a, **k: drawn.append(1))
    event = by_name(layers_heads.on_tile_click(click(*at), session, *CONTROLS), layers_heads.CLICKED)
    assert not drawn and (session.layer, session.head) == (2, 1)
    assert event["grid"] == quick["grid"] and event["head_view"] == quick["head_view"]
    monkeypatch.undo()
    fresh = by_name(shared.run_analysis(models, upload, checkpoint, GRID, *CONTROLS), shared.FULL_OUTPUTS)["state"]
    fresh.layer, fresh.head = 2, 1
    np.testing.assert_array_equal(pixels(quick["head_view"]), layers_heads.render_head(fresh, Controls()))
    assert quick_answer.tile_views(session, 0, 0) == {}  # the corner: the axis labels' margin
    overview = by_name(shared.run_analysis(models, upload, checkpoint, OVERVIEW, *CONTROLS), shared.FULL_OUTPUTS)["state"]
    assert quick_answer.tile_views(overview, *at) == {}


def test_a_double_click_leaves_the_views_drawn_ahead_for_the_event(checkpoint, upload, monkeypatch):
    models = ModelCache()
    session = by_name(shared.run_analysis(models, upload, checkpoint, GRID, *CONTROLS), shared.FULL_OUTPUTS)["state"]
    first = quick_answer.quick_views(session, 7, 9)
    assert quick_answer.quick_views(session, 7, 9) == first
    drawn = []
    monkeypatch.setattr(pictures, "grid_picture", lambda *a, **k: drawn.append(1))
    event = by_name(shared.on_patch_click(models, click(7, 9), session, GRID, *CONTROLS), shared.QUERIED)
    assert not drawn and event["grid"] == first["grid"]


def test_a_dear_backbone_is_not_sent_ahead(checkpoint, upload, monkeypatch):
    """Seconds of analysis are better shown with the event's progress than as a dimmed page."""
    answers = QuickAnswers(ModelCache())
    monkeypatch.setattr(quick_answer, "AHEAD_FLOPS", 0.0)
    outputs = analysed(answers, upload, checkpoint, OVERVIEW)
    assert 'data-uploads-ahead="0"' in outputs["session_key"]
    assert answers.uploaded_views(outputs["state"], "next.png", Path(upload).read_bytes()) == {}
    assert not answers.kept
