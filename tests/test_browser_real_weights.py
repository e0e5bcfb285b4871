"""The real DINOv2 ViT-S/14 (``real_weights``) in the served app at 224 and 518 px, as a user brings a
pretrained backbone: the summary says it is a backbone, the grid and rollout draw, a clicked eye is explained by its own
token, and screenshots of each go to test-output/dinov2/ for a person to look at."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image
from serving import chromium_page, click_natural, image_bytes, open_and_upload, running_server, wait_for_change

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.real_weights, pytest.mark.timm]
pytest.importorskip("playwright.sync_api")
skimage_data = pytest.importorskip("skimage.data")

OUTPUT = Path(__file__).resolve().parent.parent / "test-output" / "dinov2"


@pytest.mark.parametrize("size", [224, 518])
def test_the_real_backbone_in_the_app(dinov2_weights, tmp_path, size):
    OUTPUT.mkdir(parents=True, exist_ok=True)
    photo = tmp_path / "chelsea.png"
    Image.fromarray(skimage_data.chelsea()).save(photo)
    spec = f"timm:vit_small_patch14_dinov2@{dinov2_weights / 'timm.safetensors'}"
    with running_server(spec, tmp_path / "server.log", "--input-size", str(size), timeout_s=300) as (url, _):
        with chromium_page(1440, 900) as (page, errors):
            open_and_upload(page, url, photo, timeout_ms=300_000)
            grid = size // 14
            page.locator("#summary summary").first.click()  # the model's details, folded under its name
            page.get_by_text(f"{grid}×{grid} patches of 14×14 px").first.wait_for(timeout=30_000)
            assert page.get_by_text("Backbone: no classifier head").first.is_visible()
            page.screenshot(path=str(OUTPUT / f"{size}-overview.png"), full_page=True)
            page.get_by_role("tab", name="Layers × heads").click()
            page.wait_for_selector("#grid img", timeout=300_000)
            page.wait_for_timeout(500)
            page.screenshot(path=str(OUTPUT / f"{size}-grid.png"), full_page=True)
            page.get_by_role("tab", name="Rollout").click()
            page.wait_for_selector("#rollout-view img", timeout=300_000)
            page.wait_for_timeout(500)
            page.screenshot(path=str(OUTPUT / f"{size}-rollout.png"), full_page=True)
            if size == 224:  # a similarity target opens the class-specific maps and their faithfulness score
                page.get_by_label("Target (a similarity)").first.click()
                page.get_by_role("option", name="similarity to its own embedding").click()
                page.get_by_role("tab", name="Class maps").click()
                page.get_by_label("AttnLRP").first.check()
                page.get_by_text("Target: similarity to the image's own embedding").first.wait_for(timeout=300_000)
                page.locator("#score").click()
                page.wait_for_selector("#faithfulness g.mark-line.role-mark path", timeout=300_000)
                page.get_by_text("(curves of the share of the image's score)").first.wait_for(timeout=30_000)
                page.wait_for_timeout(500)
                page.screenshot(path=str(OUTPUT / f"{size}-similarity-score.png"), full_page=True)
            assert errors == []


# the class-specific methods as the Class maps tab names them, and the file names of their screenshots
METHOD_SCREENSHOTS = {"AttnLRP": "attnlrp", "LeGrad": "legrad", "relevance (Chefer et al.)": "relevance",
                      "gradient-weighted rollout": "grad-rollout"}


def test_a_clicked_eye_on_the_real_backbone(dinov2_weights, tmp_path):
    """Her eye (row 3, col 6 of the astronaut at 224 px) clicked as a user would: the Tokens tab shows the cosine map of
    the output tokens to it and their principal components, then the target *this patch* gives every method's map of it;
    screenshots of each go to test-output/dinov2/eye-*.png."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    photo = tmp_path / "astronaut.png"
    Image.fromarray(skimage_data.astronaut()).save(photo)
    spec = f"timm:vit_small_patch14_dinov2@{dinov2_weights / 'timm.safetensors'}"
    with running_server(spec, tmp_path / "server.log", "--input-size", "224", timeout_s=300) as (url, _):
        with chromium_page(1440, 900) as (page, errors):
            open_and_upload(page, url, photo, timeout_ms=300_000)
            page.get_by_text("16×16 patches of 14×14 px").first.wait_for(state="attached", timeout=30_000)
            width = page.locator("#query-image img").first.evaluate("(img) => img.naturalWidth")
            before = image_bytes(page, "query-image")
            click_natural(page, "query-image", 6.5 * width / 16, 3.5 * width / 16)
            wait_for_change(page, "query-image", before)
            page.locator("#query-caption >> text=patch at row 3, col 6").first.wait_for(timeout=30_000)
            page.get_by_role("tab", name="Tokens").click()
            page.wait_for_selector("#token-similarity img", timeout=60_000)
            page.wait_for_timeout(500)
            page.screenshot(path=str(OUTPUT / "eye-tokens.png"), full_page=True)
            panels = [page.locator("#token-similarity").screenshot(), page.locator("#token-components").screenshot()]
            page.get_by_label("Target (a similarity)").first.click()
            page.get_by_role("option", name="the query patch: its own output token").click()
            page.get_by_role("tab", name="Class maps").click()
            page.wait_for_selector("#class-view img", timeout=300_000)
            for label, name in METHOD_SCREENSHOTS.items():
                before = image_bytes(page, "class-view")
                page.get_by_label(label, exact=False).first.check()
                wait_for_change(page, "class-view", before, timeout_s=300)
                page.get_by_text("patch (row 3, col 6): its own output token").first.wait_for(timeout=30_000)
                page.wait_for_timeout(500)
                page.screenshot(path=str(OUTPUT / f"eye-{name}.png"), full_page=True)
                panels.append(page.locator("#class-view").screenshot())
            # what each head writes into the eye's own token: the grid, the largest head's split, the bars and the lens
            page.get_by_role("tab", name="Head contributions").click()
            page.wait_for_selector("#contributions-lens img", timeout=300_000)
            page.get_by_text("the parts add up to").first.wait_for(timeout=30_000)
            page.wait_for_timeout(500)
            page.screenshot(path=str(OUTPUT / "eye-contributions.png"), full_page=True)
            assert errors == []
    side_by_side(panels, columns=3).save(OUTPUT / "eye-panel.png")


def side_by_side(pngs: list[bytes], columns: int) -> Image.Image:
    """The screenshots ``pngs`` in rows of ``columns``, for one picture of every view of the click."""
    pictures = [Image.open(io.BytesIO(png)).convert("RGB") for png in pngs]
    width, height = max(p.width for p in pictures), max(p.height for p in pictures)
    rows = -(-len(pictures) // columns)
    sheet = Image.new("RGB", (columns * width, rows * height), "white")
    for index, picture in enumerate(pictures):
        sheet.paste(picture, ((index % columns) * width, (index // columns) * height))
    return sheet
