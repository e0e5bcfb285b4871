"""A run in words (``draw.terminal``): the CLI's notes and result lines, checked against values computed here."""

from __future__ import annotations

import pytest
from conftest import TINY, photo, write_backbone_checkpoint, write_checkpoint

from vit_explorer import load_model
from vit_explorer.core.curves import ROAD
from vit_explorer.core.request import Request
from vit_explorer.draw.terminal import run_lines
from vit_explorer.run import run


@pytest.fixture
def classifier(tmp_path):
    return load_model(str(write_checkpoint(tmp_path / "tiny.safetensors", TINY, seed=3)))


def test_a_classifier_run_says_its_top_class_and_road_curves_by_their_names(classifier):
    request = Request(method="relevance", score=True, protocol=ROAD, steps=2, random_orders=1, ablation="zero")
    result = run(classifier, photo((64, 64), seed=4), request)
    probabilities = result.analysis.logits.softmax(-1)
    top = int(probabilities.argmax())
    notes, lines = run_lines(result)
    assert f"top prediction: {classifier.labels[top]} ({float(probabilities[top]):.1%})" in notes
    assert not any("no classifier head" in note for note in notes)
    scored = next(line for line in lines if line.startswith("relevance map for"))
    assert "MoRF AUC" in scored and "LeRF AUC" in scored and "deletion" not in scored and "insertion" not in scored
    ablated = next(line for line in lines if line.startswith("head ablation (zero)"))
    assert "probability" in ablated and "%" in ablated


def test_a_backbone_score_is_never_called_a_probability(tmp_path):
    backbone = load_model(str(write_backbone_checkpoint(tmp_path / "backbone.safetensors", TINY)))
    plain = run(backbone, photo((64, 64), seed=4), Request(method="rollout"))
    notes, lines = run_lines(plain)
    assert lines == [] and any(note.startswith("no classifier head, so the map was not scored") for note in notes)
    similarity = run(backbone, photo((64, 64), seed=4), Request(method="relevance", ablation="zero"))
    notes, lines = run_lines(similarity)
    score = float(similarity.analysis.logits[0])
    assert f"similarity to the image's own embedding: {score:.3f} (a projection on a unit direction, not a probability)" in notes
    ablated = next(line for line in lines if line.startswith("head ablation (zero)"))
    assert "%" not in ablated and f"{score:.3f} →" in ablated
