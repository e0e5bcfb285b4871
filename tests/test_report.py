"""explain() and the self-contained HTML: a notebook's display, save_html, and the report of analyze --html, opened
offline in a real browser."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, write_backbone_checkpoint, write_checkpoint

from vit_explorer import VitExplorerError, analyze, explain, load_model
from vit_explorer.core.analysis import class_evidence
from vit_explorer.core.maps import RolloutOptions, class_map
from vit_explorer.models.builtin import EXAMPLES

SQUARE = EXAMPLES / "05-square.png"
EMBEDDED_PNG = re.compile(r'src="data:image/png;base64,[A-Za-z0-9+/=]{200,}"')


def test_explain_gives_the_map_target_and_probability_of_the_analysis():
    model = load_model("builtin:shapes")
    explanation = explain(SQUARE, model)
    analysis = analyze(model, SQUARE)
    top = analysis.top_k(1)[0]
    expected = class_map(analysis, "relevance", class_evidence(model, analysis), RolloutOptions())
    assert explanation.method == "relevance" and explanation.target == top.label == "square"
    assert explanation.probability == pytest.approx(top.prob) and explanation.map.shape == analysis.grid
    torch.testing.assert_close(explanation.map, expected)
    # another class by name, an array as the image, and a class-agnostic map, which names no class
    from PIL import Image

    ring = explain(np.asarray(Image.open(SQUARE).convert("RGB")), model, target="ring")
    assert ring.target == "ring" and ring.probability < 0.5 and not torch.equal(ring.map, explanation.map)
    assert explain(SQUARE, model, method="rollout").target is None


def test_explain_refuses_a_class_for_a_backbone_and_an_unknown_method(tmp_path):
    backbone = load_model(str(write_backbone_checkpoint(tmp_path / "backbone.safetensors", TINY)))
    image = SQUARE
    assert explain(image, backbone, method="cls").probability is None and explain(image, backbone, method="cls").target is None
    # a backbone's default target: the similarity to its own embedding (tests/test_targets.py checks the score)
    assert explain(image, backbone).target == "similarity to the image's own embedding"
    with pytest.raises(VitExplorerError, match="no classifier head, so it has no class 3"):
        explain(image, backbone, target=3)
    with pytest.raises(VitExplorerError, match="unknown method"):
        explain(image, backbone, method="lrp")


def test_the_notebook_display_embeds_its_pictures_and_fetches_nothing(tiny_checkpoint, image_file):
    model = load_model(str(tiny_checkpoint))
    explanation = explain(image_file, model)
    shown = explanation._repr_html_()
    assert len(EMBEDDED_PNG.findall(shown)) >= 2  # the image and the map with its colour bar
    assert "relevance (Chefer et al.)" in shown and explanation.target in shown and "thing " in shown  # method, target, top-5
    assert "<script" not in shown and "http" not in shown
    # the display belongs to the explanation, the interface type; the core type is not patched at import
    import vit_explorer.core.analysis as core_analysis

    assert not hasattr(core_analysis.Analysis, "_repr_html_") and not hasattr(core_analysis.Analysis, "save_html")


def opened_offline(path: Path) -> tuple[list[int], list[str], str]:
    """``path`` opened in Chromium with the network off: each picture's natural width, the console's errors, the text."""
    from playwright import sync_api
    from serving import CHROMIUM, CHROMIUM_FLAGS

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_context(offline=True).new_page()
            errors: list[str] = []
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(path.resolve().as_uri())
            page.wait_for_load_state("load")
            widths = page.evaluate("() => Array.from(document.images).map((image) => image.naturalWidth)")
            return widths, errors, page.inner_text("body")
        finally:
            browser.close()


@pytest.mark.slow
@pytest.mark.browser
def test_the_report_of_analyze_opens_offline_with_every_picture(tmp_path):
    from vit_explorer.cli import main

    checkpoint = write_checkpoint(tmp_path / "tiny.safetensors", TINY)
    out = tmp_path / "out"
    assert main(["analyze", str(SQUARE), "--model", str(checkpoint), "--out", str(out), "--html", "--sanity", "--norms",
                 "--ablation", "--scoreboard", "--decompose", "--method", "relevance", "--steps", "4"]) == 0
    report = out / "report.html"
    assert report.stat().st_size < 5 * 2**20
    widths, errors, text = opened_offline(report)
    assert len(widths) >= 10 and all(width > 0 for width in widths), widths  # every picture decoded, none fetched
    assert errors == []
    for words in (checkpoint.name, "vit_explorer", "Layers × heads", "relevance (Chefer et al.)", "beats random orders",
                  "Sanity check", "Token norms", "Head ablation", "gradient-weighted rollout", "Scoreboard for",
                  "coarser than one map's score", "Decomposition of", "logit lens", "largest parts"):
        assert words in text or (words == "beats random orders" and "does not beat random orders" in text), words


@pytest.mark.slow
@pytest.mark.browser
def test_save_html_writes_a_page_that_opens_offline(tmp_path, tiny_checkpoint, image_file):
    explanation = explain(image_file, load_model(str(tiny_checkpoint)))
    widths, errors, text = opened_offline(explanation.save_html(tmp_path / "explanation.html"))
    assert len(widths) == 2 and all(width > 0 for width in widths) and errors == []
    assert "relevance (Chefer et al.)" in text and explanation.target in text


def test_a_similarity_report_shows_scores_never_probabilities(tmp_path):
    """A backbone explained for a patch: the report's top holds the similarity score, not "100.0%" of a softmax over one
    output, and the ablation says how far the score fell, in its own units."""
    from vit_explorer.cli import main

    backbone = write_backbone_checkpoint(tmp_path / "backbone.safetensors", TINY)
    out = tmp_path / "out"
    assert main(["analyze", str(SQUARE), "--model", str(backbone), "--out", str(out), "--target", "patch:1,2", "--ablation",
                 "--html", "--no-faithfulness"]) == 0
    text = (out / "report.html").read_text()
    assert "<h2>Target score</h2>" in text and "patch (row 1, col 2): its own output token: <b>" in text
    assert "100.0%" not in text and "probability" not in text.split("<h2>Head ablation")[1]
    ablation = json.loads((out / "ablation.json").read_text())
    assert re.search(r"lowers it most, by -?\d+\.\d{3} \(-?\d+\.\d{3} → -?\d+\.\d{3}\)",
                     text), text.split("<h2>Head ablation")[1][-400:]
    assert ablation["target"] == 0


def test_the_report_holds_the_decomposition_it_was_asked_for(tmp_path):
    """``analyze --html --decompose``: the report shows the decomposition the run wrote (its heads, its largest parts with
    the values of ``decomposition.json``, the lens), and none without ``--decompose``."""
    from vit_explorer.cli import main

    checkpoint = write_checkpoint(tmp_path / "tiny.safetensors", TINY)
    for flags, out in ((["--decompose"], tmp_path / "with"), ([], tmp_path / "without")):
        assert main(["analyze", str(SQUARE), "--model", str(checkpoint), "--out", str(out), "--html", "--no-faithfulness",
                     *flags]) == 0
    text = (tmp_path / "with" / "report.html").read_text()
    record = json.loads((tmp_path / "with" / "decomposition.json").read_text())
    section = text.split(f"<h2>Decomposition of {record['target_label']}</h2>")[1]
    top = record["top_parts"][0]
    assert f"<td>{top['part']}</td><td>{top['contribution']:+.4g}</td>" in section
    assert section.count("<img") == 3  # the heads, the chart of every part, the lens
    assert "Decomposition of" not in (tmp_path / "without" / "report.html").read_text()


def test_an_explanation_prints_in_one_short_line(tiny_checkpoint, image_file):
    explanation = explain(str(image_file), model=str(tiny_checkpoint), method="attnlrp")
    text = repr(explanation)
    assert len(text) < 300 and "\n" not in text and "method='attnlrp'" in text and "[4×4]" in text, text
    assert len(repr(explanation.analysis)) < 300 and "3 layers × 4 heads" in repr(explanation.analysis)
    assert explanation.strength is not None and explanation.strength > 0
