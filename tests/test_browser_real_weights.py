"""The real DINOv2 ViT-S/14 (``real_weights``) in the served app at 224 and 518 px, as a user brings a
pretrained backbone: the summary says it is a backbone, the grid and rollout draw, and screenshots of the
overview, the grid and rollout go to test-output/dinov2/ for a person to look at."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image
from serving import chromium_page, open_and_upload, running_server

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
