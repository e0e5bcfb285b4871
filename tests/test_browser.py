"""A real browser against the served app: upload, overview, tile click, patch click, class maps and their score,
head statistics drawn when their tab opens, with values on hover; a full-page screenshot of every tab at
1280×800 and 1920×1080 in test-output/browser/, and the time from upload to maps on screen (reported, not asserted)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import CLI_MODEL, flag_all_calibration, photo, write_checkpoint, write_stats_folder
from PIL import Image
from serving import (
    chromium_page,
    click_natural,
    image_bytes,
    open_and_upload,
    running_app,
    running_server,
    wait_for_change,
    wait_or_explain,
)

from vit_explorer import analyze, load_model
from vit_explorer.core.maps import heads_view
from vit_explorer.draw import pictures
from vit_explorer.web.tabs import TABS as APP_TABS

pytestmark = [pytest.mark.browser, pytest.mark.slow]
pytest.importorskip("playwright.sync_api")
OUTPUT = Path(__file__).resolve().parent.parent / "test-output" / "browser"


def shown_scale(page, elem_id: str) -> float:
    """How much the page shrinks the picture in ``#elem_id`` (1.0: natural size; images are never scaled up)."""
    image = page.locator(f"#{elem_id} img").first
    natural_w, natural_h = image.evaluate("(img) => [img.naturalWidth, img.naturalHeight]")
    box = image.bounding_box()
    return min(1.0, box["width"] / natural_w, box["height"] / natural_h)


def scrolls_sideways(page) -> bool:
    return page.evaluate("() => document.documentElement.scrollWidth > window.innerWidth")


def cut_off(page, elem_id: str) -> list[str]:
    """Elements inside ``#elem_id`` whose content is wider than their box where they clip or scroll it."""
    return page.locator(f"#{elem_id}").evaluate("""(root) => Array.from(root.querySelectorAll('*')).filter((element) =>
        element.scrollWidth > element.clientWidth + 2 && getComputedStyle(element).overflowX !== 'visible'
    ).map((element) => element.tagName + '.' + element.className)""")


def points(page, elem_id: str):
    """The points Vega drew in the native plot ``#elem_id`` (an SVG renderer: one path per point)."""
    return page.locator(f"#{elem_id} g.mark-symbol.role-mark path")  # not the legend's symbols


def open_tab(page, name: str) -> None:
    """Open the tab ``name``, which the tab bar must show (it wraps rather than hiding tabs in a menu)."""
    tab = page.get_by_role("tab", name=name)
    assert tab.is_visible(), f"the tab {name!r} is not in sight"
    tab.click()


@pytest.fixture
def served(tmp_path):
    checkpoint = write_checkpoint(tmp_path / "browser.safetensors", CLI_MODEL)
    with running_app(str(checkpoint), tmp_path / "server.log") as url:
        yield url, checkpoint


TABS = tuple(tab.title for tab in APP_TABS)  # every tab, in the order the app shows them
SIZES = ((1280, 800), (1920, 1080))
# pictures carry text drawn at render.LABEL_PX pixels: shown at least this close to natural size, it stays legible
LEGIBLE_SCALE = 0.9


def test_upload_tile_click_and_patch_click_in_chromium(served, tmp_path):
    url, checkpoint = served
    upload = tmp_path / "upload.png"
    photo((256, 256), seed=11).save(upload)
    analysis = analyze(load_model(str(checkpoint)), upload)
    _, geometry = pictures.grid_picture(analysis, heads_view(analysis, 0))
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with chromium_page() as (page, errors):
        page.goto(url)
        page.wait_for_selector("#upload input[type=file]", state="attached", timeout=30_000)
        start = time.perf_counter()
        page.locator("#upload input[type=file]").set_input_files(str(upload))
        page.wait_for_selector("#overview-rollout img", timeout=90_000)
        page.wait_for_selector("#overview-last img", timeout=30_000)
        upload_to_maps_s = time.perf_counter() - start
        page.wait_for_selector("#top5 >> text=thing", timeout=30_000)
        assert page.locator("#query input").input_value() == "cls"
        assert points(page, "distance-plot").count() == 0  # a tab not yet opened is not drawn
        for elem_id in ("overview-rollout", "overview-last"):
            assert shown_scale(page, elem_id) >= LEGIBLE_SCALE, elem_id

        page.get_by_role("tab", name="Layers × heads").click()
        page.wait_for_selector("#grid img", timeout=30_000)
        for elem_id in ("grid", "head-view"):
            assert shown_scale(page, elem_id) >= LEGIBLE_SCALE, elem_id
        query_box, grid_box = page.locator("#query-image").bounding_box(), page.locator("#grid").bounding_box()
        # beside the grid: to its left, and level with it rather than below
        assert query_box["x"] + query_box["width"] <= grid_box["x"] and query_box["y"] < grid_box["y"] + grid_box["height"] / 2
        grid_before, head_before = image_bytes(page, "grid"), image_bytes(page, "head-view")
        y, x = geometry.tile_origin(2, 1)
        click_natural(page, "grid", x + geometry.tile / 2, y + geometry.tile / 2)
        head_after = wait_for_change(page, "head-view", head_before)
        grid_selected = wait_for_change(page, "grid", grid_before)  # the clicked tile is outlined
        assert page.get_by_label("Layer").first.input_value() == "2"
        page.locator("#grid-caption >> text=layer 2, head h1").first.wait_for(timeout=10_000)

        query_before = image_bytes(page, "query-image")
        click_natural(page, "query-image", 30, 30)  # row 1, col 1 of the 16×16 patches in the 320 px view
        wait_for_change(page, "query-image", query_before)  # the query patch is outlined
        wait_for_change(page, "grid", grid_selected)
        wait_for_change(page, "head-view", head_after)
        assert page.locator("#query-caption >> text=patch at row 1, col 1").first.is_visible()
        assert page.locator("#query input").input_value() == "patch at row 1, col 1"  # the dropdown shows the query

        page.get_by_role("tab", name="Class maps").click()
        page.wait_for_selector("#class-view img", timeout=30_000)
        relevance_map = image_bytes(page, "class-view")
        page.get_by_label("gradient-weighted rollout").check()
        wait_for_change(page, "class-view", relevance_map)
        page.locator("#score").click()
        page.wait_for_selector("#faithfulness g.mark-line.role-mark path", timeout=60_000)
        assert page.locator("#faithfulness g.mark-line.role-mark path").count() == 4  # the map's curves and random orders'
        assert page.get_by_text("deletion AUC").first.is_visible()
        page.locator("#scoreboard").click()  # every method, ranked
        page.wait_for_selector("#board-table table", timeout=120_000)
        page.get_by_text("Scoreboard for").first.wait_for(timeout=30_000)
        assert page.locator("#board-table").get_by_text("AttnLRP", exact=True).first.is_visible()

        page.get_by_role("tab", name="Head statistics").click()  # drawn now, when opened
        points(page, "distance-plot").first.wait_for(timeout=30_000)
        assert points(page, "distance-plot").count() == 6 * 4  # one point per layer and head
        points(page, "prefix-plot").first.hover(force=True)
        tooltip = page.locator("#vg-tooltip-element.visible")
        tooltip.wait_for(timeout=10_000)  # the values on hover
        assert "layer" in tooltip.inner_text() and "head" in tooltip.inner_text()
        tab_box, plot_box = page.locator("#tab-head_statistics").bounding_box(), page.locator("#distance-plot").bounding_box()
        assert plot_box["width"] >= 0.9 * tab_box["width"]  # full width
        assert cut_off(page, "top-heads") == []  # no column cut off

        for width, height in SIZES:  # every tab, as a user sees it on a laptop and on a desktop screen
            page.set_viewport_size({"width": width, "height": height})
            for number, tab in enumerate(TABS, 1):
                open_tab(page, tab)  # at 1280 px the last tabs are in the "More tabs" menu
                page.wait_for_timeout(400)
                assert not scrolls_sideways(page), (width, tab)
                name = tab.lower().replace(" × ", "-").replace(" ", "-")
                page.screenshot(path=str(OUTPUT / f"{width}x{height}-{number}-{name}.png"), full_page=True)
        assert errors == []
    timings = {"upload_to_maps_visible_s": round(upload_to_maps_s, 3), "model": "6 layers × 4 heads, 256 px (random weights)"}
    (OUTPUT / "timings.json").write_text(json.dumps(timings, indent=2))
    print(f"\nbrowser: {timings}")


# in the page: the order in which the pictures change and Gradio's event requests leave, from the click on
LOG_CLICK = """() => {
    if (window.__order) {  // logging already
        window.__order = [];
        return;
    }
    window.__order = [];
    const fetched = window.fetch;
    window.fetch = (...args) => {
        if (String(args[0]).includes('/queue/join')) window.__order.push('event');
        return fetched(...args);
    };
    const img = document.querySelector('#head-view img');
    new MutationObserver(() => window.__order.push(img.src.split(':')[0]))
        .observe(img, {attributes: true, attributeFilter: ['src']});
}"""
PAGE_PIXELS = """async (url) => {
    const img = new Image();
    img.src = url;
    await img.decode();
    const canvas = Object.assign(document.createElement('canvas'), {width: img.naturalWidth, height: img.naturalHeight});
    const context = canvas.getContext('2d');
    context.drawImage(img, 0, 0);
    return Array.from(context.getImageData(0, 0, canvas.width, canvas.height).data);
}"""


def test_a_patch_click_shows_the_quick_answer_before_gradio_sends_the_event_and_then_the_same_pixels(served, tmp_path):
    """The page's script (``web.quick_answer``) shows the clicked patch's views from its own request, before the click
    reaches Gradio; Gradio's event then sets the query and sends the same pictures (the script picked the same patch as
    Gradio's select event, at every one of a few clicks, some on patch borders). A tile of the grid likewise."""
    url, checkpoint = served
    upload = tmp_path / "upload.png"
    photo((256, 256), seed=12).save(upload)
    analysis = analyze(load_model(str(checkpoint)), upload)
    _, geometry = pictures.grid_picture(analysis, heads_view(analysis, 0))
    with chromium_page() as (page, errors):
        open_and_upload(page, url, upload)
        page.get_by_role("tab", name="Layers × heads").click()
        page.wait_for_selector("#head-view img", timeout=30_000)
        # a 320 px view of 16 × 16 patches of 20 px; 19.5, 40 and 100 lie on borders, where rounding decides the patch
        for x, y, patch in ((30, 30, "row 1, col 1"), (19.5, 299, None), (300, 50, "row 2, col 15"), (40, 100, None)):
            page.evaluate(LOG_CLICK)
            click_natural(page, "query-image", x, y)
            page.wait_for_function("() => document.querySelector('#head-view img').src.startsWith('blob:')", timeout=10_000)
            quick = page.evaluate(PAGE_PIXELS, page.locator("#head-view img").first.get_attribute("src"))
            page.wait_for_function("() => document.querySelector('#head-view img').src.includes('/file=')", timeout=30_000)
            order = page.evaluate("() => window.__order")
            assert order[:2] == ["blob", "event"], order
            assert page.evaluate(PAGE_PIXELS, page.locator("#head-view img").first.get_attribute("src")) == quick
            if patch is not None:
                page.locator(f"#query-caption >> text={patch}").first.wait_for(timeout=10_000)
        # clicking through heads: a tile of the grid, answered the same way
        y, x = geometry.tile_origin(3, 2)
        page.evaluate(LOG_CLICK)
        click_natural(page, "grid", x + geometry.tile / 2, y + geometry.tile / 2)
        page.wait_for_function("() => document.querySelector('#head-view img').src.startsWith('blob:')", timeout=10_000)
        quick = page.evaluate(PAGE_PIXELS, page.locator("#head-view img").first.get_attribute("src"))
        page.wait_for_function("() => document.querySelector('#head-view img').src.includes('/file=')", timeout=30_000)
        assert page.evaluate("() => window.__order")[:2] == ["blob", "event"]
        assert page.evaluate(PAGE_PIXELS, page.locator("#head-view img").first.get_attribute("src")) == quick
        page.locator("#grid-caption >> text=layer 3, head h2").first.wait_for(timeout=10_000)
        assert errors == []


LOG_UPLOAD = """() => {
    window.__order = [];
    const fetched = window.fetch;
    window.fetch = (...args) => {
        const url = String(args[0] && args[0].url || args[0]);
        if (url.includes('gradio_api/upload')) window.__order.push('gradio upload');
        return fetched(...args);
    };
    new MutationObserver(() => {
        const img = document.querySelector('#overview-rollout img');
        if (img) window.__order.push(img.src.split(':')[0]);
    }).observe(document.querySelector('#overview-rollout'),
               {subtree: true, childList: true, attributes: true, attributeFilter: ['src']});
}"""


def test_an_upload_shows_its_quick_answer_before_gradio_has_the_file_and_runs_the_model_once(tmp_path):
    """After the page's first analysis, an uploaded file goes to the quick answer first (``web.quick_answer``): its maps
    are on screen before Gradio's own upload starts, Gradio's event then shows the same pixels from the same analysis,
    and the model runs as often as for an analysis of another image outside the page."""
    from serving import free_port

    from vit_explorer.web import app
    from vit_explorer.web.session import Controls, ModelCache
    from vit_explorer.web.tabs import shared

    checkpoint = write_checkpoint(tmp_path / "browser.safetensors", CLI_MODEL)
    models = ModelCache()
    passes: list = []
    models.get(str(checkpoint)).module.register_forward_pre_hook(lambda *_: passes.append(1))
    demo = app.build_demo(str(checkpoint), models)
    demo.queue()
    port = free_port()
    app.launch(demo, server_name="127.0.0.1", server_port=port, quiet=True)
    first, second = tmp_path / "first.png", tmp_path / "second.png"
    photo((256, 256), seed=21).save(first)
    photo((300, 200), seed=22).save(second)
    try:
        with chromium_page() as (page, errors):
            open_and_upload(page, f"http://127.0.0.1:{port}/", first)  # no session yet: the event alone
            page.wait_for_function("() => document.querySelector('#session-key [data-session]')", timeout=30_000)
            page.wait_for_timeout(1000)
            before = len(passes)
            page.evaluate(LOG_UPLOAD)
            page.locator("#upload input[type=file]").set_input_files(str(second))
            page.wait_for_function("() => document.querySelector('#overview-rollout img').src.startsWith('blob:')",
                                   timeout=30_000)
            quick = page.evaluate(PAGE_PIXELS, page.locator("#overview-rollout img").first.get_attribute("src"))
            page.wait_for_function("() => document.querySelector('#overview-rollout img').src.includes('/file=')", timeout=30_000)
            page.wait_for_timeout(1000)
            order = page.evaluate("() => window.__order")
            assert order[:2] == ["blob", "gradio upload"], order
            assert page.evaluate(PAGE_PIXELS, page.locator("#overview-rollout img").first.get_attribute("src")) == quick
            uploaded = len(passes) - before
            assert not page.evaluate("() => document.body.classList.contains('vit-explorer-waiting')")  # no longer dimmed
            assert "300×200 image" in page.locator("#summary").inner_text()  # the new image's analysis, by the event too
            assert errors == []
    finally:
        demo.close()
    passes.clear()
    shared.run_analysis(models, str(first), str(checkpoint), "Overview", *Controls().values())
    assert uploaded == len(passes) > 0


def test_a_flagged_image_shows_the_outside_notice_above_the_predictions(tmp_path):
    """The notice as a user sees it, on a model whose calibration flags every image (what the shipped
    model flags is tested in ``test_default_model``)."""
    checkpoint = write_checkpoint(tmp_path / "calibrated.safetensors", CLI_MODEL, ood=flag_all_calibration())
    upload = tmp_path / "wide.png"
    photo((451, 300), seed=3).save(upload)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with running_app(str(checkpoint), tmp_path / "server.log") as url, chromium_page(1440, 1000) as (page, _):
        page.goto(url)
        page.locator("#upload input[type=file]").set_input_files(str(upload))
        notice = page.locator("#summary >> text=Outside what this model knows").first
        notice.wait_for(timeout=90_000)
        page.wait_for_selector("#top5 >> text=thing", timeout=30_000)
        assert page.locator("#summary >> text=nothing real").first.is_visible()
        assert page.locator("#summary >> text=451×300 image").first.is_visible()
        notice_box, predictions_box = notice.bounding_box(), page.locator("#top5").bounding_box()
        assert notice_box["y"] < predictions_box["y"]
        page.screenshot(path=str(OUTPUT / "5-outside-notice.png"), full_page=False)


def test_a_bad_upload_shows_one_notice_and_no_error_pills(served, tmp_path):
    url, _ = served
    """A file that is not an image: one notice and the summary say why; no view is stamped with a red "Error" (raising
    from the upload event stamped each of its eight visible outputs)."""
    bad = tmp_path / "not-an-image.png"
    bad.write_bytes(b"<html><body>hello</body></html>")
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with chromium_page(1280, 800) as (page, errors):
        good = tmp_path / "good.png"
        photo((96, 96)).save(good)
        open_and_upload(page, url, good)
        page.wait_for_function("() => document.querySelector('#target input').value.startsWith('thing')", timeout=30_000)
        page.locator("#upload input[type=file]").set_input_files(str(bad))
        page.locator("#summary >> text=This image could not be analysed").first.wait_for(timeout=60_000)
        page.wait_for_timeout(1000)  # any error state would have arrived with the same response
        assert page.locator("#summary >> text=not an image file").first.is_visible()
        assert page.locator("#target input").input_value() == ""  # not the previous image's target
        assert page.locator(".toast-body").count() == 1
        pills = page.locator(".error:not([class*=toast])")
        assert pills.count() == 0, [pills.nth(i).inner_text() for i in range(pills.count())]
        page.screenshot(path=str(OUTPUT / "6-bad-upload.png"), full_page=False)
        assert errors == []


def test_a_stats_folder_overlays_the_dataset_on_the_head_statistics(served, tmp_path):
    url, checkpoint = served
    write_stats_folder(load_model(str(checkpoint)), tmp_path, seed=60)
    upload = tmp_path / "upload.png"
    photo((256, 256), seed=12).save(upload)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with chromium_page() as (page, _):
        open_and_upload(page, url, upload)
        page.get_by_role("tab", name="Head statistics").click()
        points(page, "distance-plot").first.wait_for(timeout=30_000)
        assert points(page, "distance-plot").count() == 6 * 4
        folder = page.locator("#stats-folder textarea, #stats-folder input").first
        folder.fill(str(tmp_path / "stats"))
        folder.press("Enter")
        page.locator("#dataset-note >> text=3 images of").first.wait_for(timeout=30_000)
        page.wait_for_selector("#dataset-chart img", timeout=30_000)  # this image against the dataset's ranges
        assert shown_scale(page, "dataset-chart") >= LEGIBLE_SCALE
        assert points(page, "distance-plot").count() == 6 * 4  # the interactive plots stay this image's
        page.locator("#dataset-chart").scroll_into_view_if_needed()
        page.screenshot(path=str(OUTPUT / "1280x800-head-statistics-with-dataset.png"), full_page=True)


def test_head_ablation_and_token_norms_tabs_in_chromium(served, tmp_path):
    """Run the ablation, click a head, see the prediction without it; then the token norms, drawn when opened."""
    from vit_explorer.core.interventions import HeadAblation
    from vit_explorer.web.tabs.head_ablation import heat_map

    url, _ = served
    upload = tmp_path / "upload.png"
    photo((256, 256), seed=11).save(upload)
    # the geometry of the heat map of a 6 × 4 model, whatever its values
    zeros = np.zeros((6, 4), dtype=np.float32)
    _, geometry = heat_map(HeadAblation("zero", 0, zeros, zeros, 0.0, 0.5, 7), None)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with chromium_page() as (page, errors):
        open_and_upload(page, url, upload)

        open_tab(page, "Head ablation")
        run = page.locator("#run-ablation")
        run.wait_for(timeout=10_000)
        assert "≈18× one forward pass" in run.inner_text()  # 6 layers × 4 heads: 105 layer evaluations ÷ 6, said on the button
        page.locator("#ablation-text >> text=Run ablation").first.wait_for(timeout=10_000)
        run.click()
        page.wait_for_selector("#ablation-view img", timeout=60_000)
        page.locator("#ablation-text >> text=Most needed").first.wait_for(timeout=10_000)
        assert shown_scale(page, "ablation-view") >= LEGIBLE_SCALE
        before = image_bytes(page, "ablation-view")
        y, x = geometry.tile_origin(2, 1)
        click_natural(page, "ablation-view", x + geometry.tile / 2, y + geometry.tile / 2)
        page.locator("#ablation-without >> text=without L2 h1").first.wait_for(timeout=30_000)
        wait_for_change(page, "ablation-view", before)  # the clicked head is outlined
        assert page.locator("#ablation-without >> text=thing").count() >= 1
        assert not scrolls_sideways(page)
        page.screenshot(path=str(OUTPUT / "1280x800-head-ablation.png"), full_page=True)

        open_tab(page, "Head contributions")  # the ablation has run: its heat map shows beside the contributions
        for elem_id in ("contributions-view", "contributions-split", "contributions-chart", "contributions-lens",
                        "contributions-ablation"):
            page.wait_for_selector(f"#{elem_id} img", timeout=60_000)
        page.locator("#contributions-text >> text=A head red in both").first.wait_for(timeout=10_000)
        assert shown_scale(page, "contributions-view") >= LEGIBLE_SCALE
        before = image_bytes(page, "contributions-split")
        click_natural(page, "contributions-view", x + geometry.tile / 2, y + geometry.tile / 2)  # L2 h1, the same grid
        wait_for_change(page, "contributions-split", before)
        page.locator("#contributions-split img").first.wait_for(timeout=10_000)
        assert not scrolls_sideways(page)
        page.screenshot(path=str(OUTPUT / "1280x800-head-contributions.png"), full_page=True)

        open_tab(page, "Token norms")
        for elem_id in ("norm-map", "norm-outliers", "norm-chart"):
            page.wait_for_selector(f"#{elem_id} img", timeout=30_000)
        page.locator("#norm-text >> text=median + k").first.wait_for(timeout=10_000)
        page.locator("#norm-layer-text >> text=Layer 5").first.wait_for(timeout=10_000)
        for elem_id in ("norm-map", "norm-outliers"):
            assert shown_scale(page, elem_id) >= LEGIBLE_SCALE, elem_id
        assert not scrolls_sideways(page)
        page.screenshot(path=str(OUTPUT / "1280x800-token-norms.png"), full_page=True)
        assert errors == []


def test_compare_tab_shows_a_second_image_beside_the_first_and_their_difference(served, tmp_path):
    url, _ = served
    main, second = tmp_path / "main.png", tmp_path / "second.png"
    photo((256, 256), seed=11).save(main)
    photo((256, 256), seed=13).save(second)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with chromium_page() as (page, errors):
        open_and_upload(page, url, main)
        open_tab(page, "Compare")
        page.locator("#compare-caption >> text=Upload a second image").first.wait_for(timeout=30_000)
        page.locator("#compare-upload input[type=file]").set_input_files(str(second))
        for elem_id in ("compare-view-a", "compare-view-b", "compare-difference"):
            page.wait_for_selector(f"#{elem_id} img", timeout=90_000)
            assert shown_scale(page, elem_id) >= LEGIBLE_SCALE, elem_id
        assert page.locator("#compare-title-b >> text=B · second.png").first.is_visible()
        assert page.locator("#compare-difference-note >> text=red where A is higher").first.is_visible()
        assert image_bytes(page, "compare-view-a") != image_bytes(page, "compare-view-b")
        page.wait_for_function("() => document.querySelectorAll('#compare-plot g.mark-symbol.role-mark path').length === 48",
                               timeout=30_000)  # 6 layers × 4 heads of each side
        # another statistic: the plot shows its values (the vertical axis follows the data: ~133 px of distance, ~5.5 nats)
        y_axis = """() => document.querySelector("#compare-plot g.role-axis[aria-label^='Y-axis']").getAttribute('aria-label')
                                 .match(/values from .*/)[0]"""
        distance_axis = page.evaluate(y_axis)
        page.locator("#compare-statistic input").first.click()
        page.get_by_role("option", name="attention entropy (nats)").click()
        page.locator("#compare-plot-note >> text=Attention entropy").first.wait_for(timeout=30_000)
        page.wait_for_function(f"() => ({y_axis})() !== {distance_axis!r}", timeout=30_000)
        rollout_a = image_bytes(page, "compare-view-a")
        page.get_by_label("layer and head").check()  # a view change: redrawn from the two analyses
        wait_for_change(page, "compare-view-a", rollout_a)
        page.locator("#compare-title-a >> text=in layer 5 of 6").first.wait_for(timeout=10_000)
        assert not scrolls_sideways(page)
        page.screenshot(path=str(OUTPUT / "1280x800-compare.png"), full_page=True)
        # B patched into A, heads and every token (6 layers × 257 tokens: a few seconds here)
        page.get_by_label("every token too (slow)").check()
        page.locator("#compare-patch").click()
        for elem_id in ("compare-patch-heads", "compare-patch-tokens"):
            page.wait_for_selector(f"#{elem_id} img", timeout=120_000)
            assert shown_scale(page, elem_id) >= LEGIBLE_SCALE, elem_id
        page.locator("#compare-patch-text >> text=B patched into A").first.wait_for(timeout=10_000)
        assert not scrolls_sideways(page)
        page.screenshot(path=str(OUTPUT / "1280x800-compare-patching.png"), full_page=True)
        assert errors == []


@pytest.mark.timm
def test_a_random_backbone_in_the_page_runs_ablation_and_flags_what_it_cannot_explain(tmp_path):
    """Random-weight DINOv2 (LayerScale 1e-5) at 56 px: once a similarity target is chosen, the ablation button opens (it
    stayed disabled: its state was set only at upload); AttnLRP's map is called negligible above it; the scoreboard's chance
    has no spread, so no method is said to stand some sd from it."""
    pytest.importorskip("timm")
    from serving import running_server

    upload = tmp_path / "upload.png"
    photo((112, 112), seed=4).save(upload)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with running_server("timm:vit_small_patch14_dinov2@random", tmp_path / "server.log", "--input-size", "56") as (url, _):
        with chromium_page(1280, 800) as (page, errors):
            open_and_upload(page, url, upload)
            open_tab(page, "Head ablation")
            run = page.locator("#run-ablation")
            run.wait_for(timeout=10_000)
            assert run.is_disabled()  # no target yet: a backbone has no class
            page.get_by_label("Target (a similarity)").first.click()
            page.get_by_role("option", name="similarity to its own embedding").click()
            page.locator("#ablation-text >> text=Which heads does the score").first.wait_for(timeout=60_000)
            page.wait_for_function("() => !document.querySelector('#run-ablation').disabled", timeout=30_000)
            run.click()
            page.wait_for_selector("#ablation-view img", timeout=60_000)
            page.screenshot(path=str(OUTPUT / "7-backbone-ablation.png"), full_page=True)

            open_tab(page, "Class maps")
            page.get_by_label("AttnLRP").first.check()
            page.locator("#class-text >> text=Negligible map").first.wait_for(timeout=60_000)
            page.locator("#scoreboard").click()
            page.locator("#board-table").wait_for(timeout=120_000)
            page.locator("#board-text >> text=do not spread").first.wait_for(timeout=30_000)
            table = page.locator("#board-table").inner_text()
            assert " sd" not in table, table
            page.screenshot(path=str(OUTPUT / "8-backbone-negligible-and-scoreboard.png"), full_page=True)
            assert errors == []


def shown_source(page, elem_id: str) -> str:
    return page.evaluate(f"() => document.querySelector('#{elem_id} img')?.src || ''")


def analyses_run(url: str) -> list[str]:
    """The events the server ran since it started, by name (Gradio's profiling, on for this server)."""
    import urllib.request

    with urllib.request.urlopen(f"{url}gradio_api/profiling/traces") as response:
        return [trace["fn_name"] for trace in json.loads(response.read())]


def test_each_upload_and_each_example_runs_the_model_once(tmp_path):
    """An image that replaces another made Gradio fire the upload's change event twice, which analysed every upload
    after the first twice; an example, which sets the image without an upload event, analyses once too."""
    from serving import running_server

    with (running_server("builtin:shapes", tmp_path / "server.log", env={"GRADIO_PROFILING": "1"}) as (url, _),
          chromium_page() as (page, errors)):
        page.goto(url)
        page.wait_for_selector("#upload input[type=file]", state="attached", timeout=30_000)
        for seed in (1, 2):
            path = tmp_path / f"upload-{seed}.png"
            photo((96, 96), seed=seed).save(path)
            before = shown_source(page, "overview-rollout")
            page.locator("#upload input[type=file]").set_input_files(str(path))
            page.wait_for_function(f"() => (document.querySelector('#overview-rollout img')?.src || '') !== {before!r}",
                                   timeout=60_000)
        page.wait_for_timeout(1500)  # a second analysis would have started by now
        assert analyses_run(url).count("analyze") == 2
        page.get_by_text("Examples (generated shapes").first.click()  # folded after an upload
        before = shown_source(page, "overview-rollout")
        page.locator("#examples button.gallery-item").first.click()
        page.wait_for_function(f"() => (document.querySelector('#overview-rollout img')?.src || '') !== {before!r}",
                               timeout=60_000)
        page.wait_for_timeout(1500)
        ran = analyses_run(url)
        assert ran.count("analyze") == 2 and ran.count("analyze_example") == 1, ran
        assert_first_screen_holds_the_maps(page, "first-screen-shapes.png")
        assert errors == []


def assert_first_screen_holds_the_maps(page, screenshot: str) -> None:
    """Once an image is analysed, the panels above the tabs are folded: at 1280 × 800 the open tab's content starts in the
    upper half of the screen (it started 580 px down, 740 with the prompts), and the image column stays beside it."""
    for panel in ("model-panel", "examples", "prompts-panel"):
        if page.locator(f"#{panel}").is_visible():
            page.wait_for_function(f"() => !document.querySelector('#{panel} .label-wrap.open')", timeout=10_000)
    page.wait_for_timeout(500)
    tab_box, query_box = page.locator("#tab-overview").bounding_box(), page.locator("#query-image").bounding_box()
    page.screenshot(path=str(OUTPUT / screenshot))
    assert tab_box["y"] < 800 / 2, tab_box
    assert query_box["x"] + query_box["width"] <= tab_box["x"] and query_box["y"] < tab_box["y"] + tab_box["height"] / 2


def test_text_prompts_on_the_shipped_shapes_clip_in_chromium(tmp_path):
    """``builtin:shapes-clip`` offers a Text prompts box; two prompts on a two-shape image of the independent generator
    give the zero-shot prediction over them, and the target menu switches AttnLRP's map between them. Screenshots of
    each prompt's map go to test-output/browser/clip-*.png."""
    from independent_shapes import CLASSES, independent_pairs
    from PIL import Image
    from serving import running_server

    pair = next(pair for pair in independent_pairs(60) if {CLASSES[label] for label in pair.labels} == {"star", "circle"})
    upload = tmp_path / "star-and-circle.png"
    Image.fromarray(pair.image).save(upload)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    prompts = ("the star", "the circle")
    with running_server("builtin:shapes-clip", tmp_path / "server.log") as (url, _), chromium_page(1280, 800) as (page, errors):
        open_and_upload(page, url, upload)
        box = page.locator("#prompts textarea")
        assert box.is_visible()
        page.get_by_text("This model reads text").first.wait_for(timeout=30_000)
        box.fill("\n".join(prompts))
        box.press("Shift+Enter")  # Enter is a new line in a box of several lines
        page.get_by_text("Best-matching prompt").first.wait_for(timeout=60_000)
        top5 = page.locator("#top5").inner_text()
        assert all(prompt in top5 for prompt in prompts), top5
        OUTPUT.mkdir(parents=True, exist_ok=True)
        assert_first_screen_holds_the_maps(page, "first-screen-shapes-clip.png")
        page.get_by_text("Text prompts").first.click()  # folded once submitted: open again to change them
        assert box.is_visible() and box.input_value() == "\n".join(prompts)
        open_tab(page, "Class maps")
        page.get_by_label("AttnLRP").first.check()
        for prompt in prompts:
            page.get_by_label("Target class").first.click()
            page.get_by_role("option", name=prompt).first.click()
            page.locator(f"#class-text >> text={prompt}").first.wait_for(timeout=60_000)
            page.wait_for_timeout(500)
            page.screenshot(path=str(OUTPUT / f"clip-{prompt.replace(' ', '-')}.png"), full_page=True)
        assert errors == []


def test_the_head_atlas_tab_loads_an_atlas_and_a_click_shows_a_head(served, tmp_path):
    from vit_explorer.cli import main
    from vit_explorer.draw import files

    url, checkpoint = served
    assert main(["make-shapes", str(tmp_path / "set"), "--count", "12", "--seed", "8"]) in (0, None)
    assert main(["atlas", str(tmp_path / "set" / "images"), "--model", "builtin:shapes-clip", "--out",
                 str(tmp_path / "atlas"), "--texts-per-head", "3"]) in (0, None)
    geometry = pictures.atlas_picture(files.read_atlas(tmp_path / "atlas"))[1]
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with chromium_page() as (page, errors):
        page.goto(url)
        page.get_by_role("tab", name="Head atlas").wait_for(timeout=30_000)
        open_tab(page, "Head atlas")  # no image needed: the atlas is the folder's
        folder = page.locator("#atlas-folder textarea, #atlas-folder input").first
        folder.fill(str(tmp_path / "atlas"))
        folder.press("Enter")
        page.wait_for_selector("#atlas-grid img", timeout=30_000)
        page.locator("#atlas-summary >> text=over 12 images").wait_for(timeout=30_000)
        page.locator("#atlas-images img").first.wait_for(timeout=30_000)
        assert shown_scale(page, "atlas-grid") >= LEGIBLE_SCALE and not scrolls_sideways(page)
        page.screenshot(path=str(OUTPUT / "1280x800-head-atlas.png"), full_page=True)
        y, x = geometry.tile_origin(1, 2)
        click_natural(page, "atlas-grid", x + geometry.tile / 2, y + geometry.tile / 2)
        page.locator("#atlas-head >> text=Layer 1, head h2").wait_for(timeout=30_000)
        page.screenshot(path=str(OUTPUT / "1280x800-head-atlas-clicked.png"), full_page=True)
        # computed in the page, by the page's model (the served checkpoint) over the same folder
        source = page.locator("#atlas-source textarea, #atlas-source input").first
        source.fill(str(tmp_path / "set" / "images"))
        page.locator("#atlas-compute").click()
        # the new summary, not the progress line (which names the model and the folder too)
        page.wait_for_function("""(name) => {
            const text = document.querySelector('#atlas-summary').innerText;
            return text.includes(name) && text.includes('Click a head') && !text.includes('batch');
        }""", arg=checkpoint.name, timeout=60_000)
        assert "over 12 images" in page.locator("#atlas-summary").inner_text()
        head_text = page.locator("#atlas-head").inner_text()
        assert head_text.startswith("Layer") and "does not load here" not in head_text  # the page's model: the splits shown
        page.screenshot(path=str(OUTPUT / "1280x800-head-atlas-computed.png"), full_page=True)
    assert errors == []


def choose_head(page, layer: int, head: int, colouring: str) -> None:
    """Show ``layer``, ``head`` in the Queries and keys tab, coloured by ``colouring`` (its radio's label)."""
    before = page.locator("#qk-caption").inner_text()
    number = page.locator("#qk-layer input[type=number]")
    number.fill(str(layer))
    number.press("Enter")
    page.locator(f"#qk-caption >> text=Layer {layer}, head").first.wait_for(timeout=30_000)
    page.locator("#qk-head input").click()
    page.get_by_role("option", name=f"h{head}", exact=True).click()
    page.locator(f"#qk-caption >> text=Layer {layer}, head {head}").first.wait_for(timeout=30_000)
    page.locator("#qk-colouring label", has_text=colouring).click()
    page.wait_for_function("""([caption, colouring]) => document.querySelector('#qk-plot svg text')
        && document.querySelector('#qk-plot svg text').textContent.includes(colouring)""",
                           arg=[before, colouring], timeout=30_000)


def test_the_queries_and_keys_tab_on_the_shipped_model_in_chromium(tmp_path):
    """The shipped model's queries and keys in one picture: a head that sorts patches by position (layer 2, head 3) and
    one that sorts them by colour far more than by position (layer 3, head 0), found on this image by
    benchmarks/query_key_view.py; hover names a token, and a click on a query point makes it the query."""
    image = Path(__file__).resolve().parent.parent / "assets" / "examples" / "03-circle.png"
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with running_app("builtin:shapes", tmp_path / "server.log") as url, chromium_page(1280, 900) as (page, errors):
        open_and_upload(page, url, image)
        open_tab(page, "Queries and keys")
        page.wait_for_selector("#qk-plot svg circle.q", timeout=30_000)
        layout = load_model("builtin:shapes").layout
        tokens, clicked = layout.num_tokens, layout.patch_token(2, 3)
        assert page.locator("#qk-plot svg circle.q").count() == tokens
        assert page.locator("#qk-plot svg circle.k").count() == tokens
        assert "every attention weight is unchanged" in page.locator("#qk-caption").inner_text()
        # hover: the browser's own tooltip, the point's <title>
        first = page.locator("#qk-plot svg circle.q[data-token='1']")
        assert first.locator("title").text_content().startswith("query · patch at row 0, col 0")
        choose_head(page, 2, 3, "patch row")
        page.screenshot(path=str(OUTPUT / "1280x900-queries-keys-positional.png"), full_page=True)
        choose_head(page, 3, 0, "the patch's colour (contrast stretched)")
        page.screenshot(path=str(OUTPUT / "1280x900-queries-keys-content.png"), full_page=True)
        # a click on a query point makes its token the query: the query caption names it and the point is ringed
        point = page.locator(f"#qk-plot svg circle.q[data-token='{clicked}']")
        point.scroll_into_view_if_needed()
        point.dispatch_event("click")  # on the point itself: where points overlap, a mouse click lands on the topmost
        page.locator("#qk-caption >> text=patch at row 2, col 3) is ringed").first.wait_for(timeout=30_000)
        assert page.locator(f"#qk-plot svg circle.q[data-token='{clicked}']").get_attribute("r") == "6"
        assert "Query: patch at row 2, col 3" in page.locator("#query-caption").inner_text()
        assert not scrolls_sideways(page)
        page.screenshot(path=str(OUTPUT / "1280x900-queries-keys-clicked.png"), full_page=True)
        # the head over the seven examples at once
        page.get_by_text("A folder sample").click()
        page.locator("#qk-folder textarea, #qk-folder input").first.fill(str(image.parent))
        page.locator("#qk-sample-button").click()
        wait_or_explain(page, "#qk-sample-plot svg circle", tmp_path / "server.log", timeout_ms=120_000)
        assert page.locator("#qk-sample-plot svg circle").count() == 2 * 7 * tokens
        assert "over 7 images" in page.locator("#qk-sample-caption").inner_text()
        page.locator("#qk-sample-plot").scroll_into_view_if_needed()
        page.screenshot(path=str(OUTPUT / "1280x900-queries-keys-sample.png"), full_page=True)
        assert errors == []


def test_the_test_time_register_tab_shows_the_planted_spot_gone_in_chromium(tmp_path):
    """The planted model (one MLP neuron makes patch (1, 1) a high-norm outlier), calibrated by the CLI's stage over a
    folder and served with its registers file: both sides, their token norms, and both scoreboards."""
    from test_registers import write_planted_checkpoint

    from vit_explorer import run

    checkpoint = write_planted_checkpoint(tmp_path / "planted.safetensors")
    folder = tmp_path / "calibration"
    folder.mkdir()
    for seed in range(6):
        photo((64, 64), seed=seed).save(folder / f"{seed}.png")
    registers = tmp_path / "registers.json"
    registers.write_text(run.registers(str(checkpoint), folder, top_k=2, highest_layer=2).to_json())
    upload = tmp_path / "upload.png"
    photo((64, 64), seed=40).save(upload)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with running_server(str(checkpoint), tmp_path / "server.log", "--registers", str(registers)) as (url, _), \
            chromium_page(1280, 1000) as (page, errors):
        open_and_upload(page, url, upload)
        open_tab(page, "Test-time register")
        for elem_id in ("register-map-without", "register-map-with", "register-norms-without", "register-norms-with"):
            page.wait_for_selector(f"#{elem_id} img", timeout=30_000)
        text = page.locator("#register-text").inner_text()
        assert "High-norm patches in any layer (the Token norms rule): 1 without, 0 with" in text
        page.locator("#register-score").click()
        page.wait_for_selector("#register-table-with table", timeout=120_000)
        assert page.locator("#register-board-text").inner_text().count("Scoreboard for") == 2
        assert not scrolls_sideways(page)
        page.screenshot(path=str(OUTPUT / "1280x1000-test-time-register.png"), full_page=True)
        assert errors == []


@pytest.mark.timm
def test_a_swin_in_the_page_its_stage_grids_a_clicked_patchs_windows_and_the_rollout_across_stages(tmp_path):
    """A random-weight Swin-T at 224 px: the first stage's 56 × 56 grid of 4 px patches, a clicked patch's row in each
    block and head (patch (1, 1): its 7 × 7 window in the first block; in the second, shifted by 3 patches, its window
    wraps round the image's corner and the mask keeps it to the 3 × 3 patches of its own region), the rollout chained
    across the four stages, and stage 2 (14 × 14 patches of 16 px) chosen from the model menu."""
    pytest.importorskip("timm")
    from skimage import data as skimage_data

    upload = tmp_path / "chelsea.png"
    Image.fromarray(skimage_data.chelsea()).crop((60, 0, 360, 300)).resize((224, 224)).save(upload)
    spec = "timm:swin_tiny_patch4_window7_224@random"
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with running_server(spec, tmp_path / "server.log") as (url, _), chromium_page(1280, 900) as (page, errors):
        open_and_upload(page, url, upload, timeout_ms=180_000)
        page.wait_for_function("() => document.querySelector('#target input').value !== ''", timeout=120_000)  # evidence
        prediction = page.locator("#top5").inner_text()
        summary = page.locator("#summary").text_content()  # its details are folded
        assert "2 layers × 3 heads" in summary and "56×56 patches of 4×4 px" in summary
        assert "stage 0 of stages 0…3" in summary
        page.screenshot(path=str(OUTPUT / "1280x900-swin-overview.png"), full_page=True)
        open_tab(page, "Layers × heads")
        page.wait_for_selector("#grid img", timeout=60_000)
        query_before = image_bytes(page, "query-image")
        click_natural(page, "query-image", 1.5 * 320 / 56, 1.5 * 320 / 56)  # patch (1, 1) of the 56 × 56 in the 320 px view
        wait_for_change(page, "query-image", query_before)
        page.locator("#query-caption >> text=patch at row 1, col 1").first.wait_for(timeout=60_000)
        page.wait_for_timeout(1500)  # the grid follows the query
        page.screenshot(path=str(OUTPUT / "1280x900-swin-clicked-window.png"), full_page=True)
        open_tab(page, "Class maps")
        page.wait_for_selector("#class-view img", timeout=120_000)
        page.get_by_label("attention rollout", exact=True).check()
        page.wait_for_timeout(1500)
        page.screenshot(path=str(OUTPUT / "1280x900-swin-rollout.png"), full_page=True)
        page.get_by_text("Model and fit").click()  # folded once an image is analysed
        model = page.get_by_label("Model")
        model.fill(f"{spec}#stage=2")
        model.press("Enter")
        page.wait_for_function("() => document.querySelector('#summary').textContent.includes('stage 2 of stages 0…3')",
                               timeout=180_000)
        assert "14×14 patches of 16×16 px" in page.locator("#summary").text_content()
        # the clicked patch stays on the image: patch (1, 1) of 4 px is in patch (0, 0) of 16 px
        assert "Query: patch at row 0, col 0" in page.locator("#query-caption").inner_text()
        # the stage is a view of the model loaded, not another random draw: the same prediction
        assert page.locator("#top5").inner_text() == prediction, (tmp_path / "server.log").read_text()[-3000:]
        open_tab(page, "Layers × heads")
        page.wait_for_selector("#grid img", timeout=60_000)
        page.wait_for_timeout(1500)
        page.screenshot(path=str(OUTPUT / "1280x900-swin-stage-2.png"), full_page=True)
        assert not scrolls_sideways(page)
        assert errors == []
