"""The shipped shapes-CLIP (``builtin:shapes-clip``), judged on images drawn by ``independent_shapes``, code that shares
nothing with the generator it was trained on: zero-shot accuracy on one-shape images, and text-sensitive pointing on
two-shape images (the AttnLRP map of each shape's prompt peaks on that shape)."""

import numpy as np
import pytest
import torch
from independent_shapes import CLASSES, independent_pairs, independent_set
from PIL import Image

from vit_explorer import load_model
from vit_explorer.core import maps
from vit_explorer.core.analysis import analyze, class_evidence
from vit_explorer.core.targets import Prompts, prompt_model
from vit_explorer.methods.evaluation import bootstrap_interval, class_sensitive_hit
from vit_explorer.shapes.captions import Caption, Thing, true_captions
from vit_explorer.shapes.train_clip import zero_shot_prompt

PAIRS, SINGLES = 100, 200
OPTIONS = maps.RolloutOptions()


@pytest.fixture(scope="module")
def shapes_clip():
    model = load_model("builtin:shapes-clip", device="cpu")
    return model, prompt_model(model, Prompts(tuple(zero_shot_prompt(label) for label in range(len(CLASSES)))))


def test_the_shipped_shapes_clip_reads_text_offline(shapes_clip):
    model, prompted = shapes_clip
    assert model.text is not None and model.num_classes == 0 and prompted.labels == [f"a {name}" for name in CLASSES]
    assert any("knows 25 words" in note for note in model.notes)  # the app and the CLI say which words it knows
    assert any("on a photo its matches mean nothing" in note for note in model.notes)  # and what it was trained on
    embeddings = model.text.embed(["a star", "a circle", "the star on the left"])
    assert embeddings.shape == (3, model.module.transformer.norm.normalized_shape[0])
    assert not torch.allclose(embeddings[0], embeddings[1], atol=1e-3)


def zero_shot_hits(prompted, count: int) -> list[float]:
    return [float(analyze(prompted, Image.fromarray(drawn.image), explain=False).logits.argmax() == drawn.label)
            for drawn in independent_set(count)]


@pytest.mark.slow
def test_zero_shot_accuracy_on_independent_single_shapes(shapes_clip):
    _, prompted = shapes_clip
    hits = zero_shot_hits(prompted, SINGLES)
    low, high = bootstrap_interval(hits)
    print(f"zero-shot accuracy {np.mean(hits):.3f} [{low:.3f}, {high:.3f}] on {SINGLES} independent images")
    assert np.mean(hits) >= 0.8


@pytest.mark.slow
def test_each_shape_prompt_points_at_its_own_shape_on_independent_pairs(shapes_clip):
    """On two-shape images of the independent generator, the AttnLRP map of "a <shape>" for each of the two shapes
    peaks on that shape (``class_sensitive_hit``) on at least 80% of images."""
    _, prompted = shapes_clip
    hits = []
    for pair in independent_pairs(PAIRS):
        analysis = analyze(prompted, Image.fromarray(pair.image), explain=False)
        maps_by_shape = [maps.class_map(analysis, "attnlrp", class_evidence(prompted, analysis, label, ("attnlrp",)), OPTIONS)
                         for label in pair.labels]
        hits.append(float(class_sensitive_hit(maps_by_shape, list(zip(pair.labels, pair.masks, strict=True)),
                                              prompted.layout.grid_hw)))
    low, high = bootstrap_interval(hits)
    print(f"text-sensitive pointing {np.mean(hits):.3f} [{low:.3f}, {high:.3f}] on {PAIRS} independent pairs")
    assert np.mean(hits) >= 0.8


def test_captions_are_claims_whose_truth_is_computed():
    """A caption is true of an image when its claim holds there: the loss's labels, so "a star" is a positive for every
    star image of a batch, not only for the one it was drawn for."""
    left_star, right_circle = Thing(3, (60.0, 128.0), 40.0), Thing(0, (190.0, 120.0), 100.0)
    pair = (left_star, right_circle)
    assert Caption("side", (3,), "left").text == "the star on the left" and Caption("side", (3,), "left").true_of(pair)
    assert not Caption("side", (3,), "right").true_of(pair) and Caption("side", (0,), "right").true_of(pair)
    assert Caption("sized", (3,), "small").true_of(pair) and Caption("sized", (0,), "large").true_of(pair)
    assert not Caption("sized", (3,), "large").true_of(pair)
    assert Caption("pair", (0, 3)).true_of(pair) and not Caption("pair", (0, 1)).true_of(pair)
    assert Caption("count", word="two").true_of(pair) and not Caption("count", word="one").true_of(pair)
    lone = (Thing(3, (128.0, 128.0), 70.0),)  # in the middle: on no side
    assert not any(Caption("side", (3,), side).true_of(lone) for side in ("left", "right", "top", "bottom"))
    assert all(caption.true_of(pair) for caption in true_captions(pair))
    assert {caption.text for caption in true_captions(lone)} == {"one shape", "a star"}


@pytest.mark.parametrize("lines, read_note", [
    ("a hexagon\na dog\nétoile\na star", ["“hexagon”", "“dog”", "“étoile”", "2 prompts read as the same text"]),
    ("\n".join(f"the star {number}" for number in range(200)), ["200 prompts read as the same text", "“0”"]),
    ("a star on the left of a circle and a ring\na circle", ["past its text length, never read: “circle and a ring”"]),
    ("a star\n" + "star " * 1000, ["(4,999 characters)"]),
    ("a star\n a star \na circle", ["more than once, counted once: “a star”"]),
    ("a star\na circle", ["read every word of the 2 prompts"]),
])
def test_each_prompt_says_what_the_model_read_of_it(shapes_clip, lines, read_note):
    """Words the word-level text tower has no token for (a shape it never saw, another language, digits), words past its
    7-word text length, a prompt reading the same as another, a repeated prompt: each is said in the summary, never
    dropped silently; a long prompt is quoted cut short."""
    from vit_explorer.core.targets import prompted
    from vit_explorer.models.builtin import EXAMPLES
    from vit_explorer.web.captions import model_summary

    model, _ = shapes_clip
    analysis = analyze(prompted(model, lines), EXAMPLES / "01-star.png", explain=False)
    summary = model_summary(analysis)
    shown, folded = summary.split("<details>")  # the model's own details fold under its name; what the prompts lost does not
    assert all(note in shown for note in read_note), summary
    assert "knows 25 words" in folded and "knows 25 words" not in shown
    assert len(summary) < 3000  # no prompt echoed in full
    given = [line.strip() for line in lines.splitlines() if line.strip()]
    assert analysis.num_classes == len(set(given)) and f"among the {len(set(given))} prompts" in summary


def test_the_word_tower_reads_digits_and_accents_as_unknown_words_not_as_nothing(shapes_clip):
    model, _ = shapes_clip
    assert model.text.read("the star 7").tokens == ("the", "star", "[unk]")
    assert model.text.read("étoile").unknown == ("étoile",)
    assert model.text.read("one two three four five six seven eight nine").cut == "eight nine"  # [cls] and seven words
    embeddings = model.text.embed(["the star 7", "the star"])
    assert not torch.allclose(embeddings[0], embeddings[1], atol=1e-4)  # the unknown token is read, not dropped


def test_an_empty_prompt_box_says_there_is_nothing_to_predict(shapes_clip):
    from vit_explorer.core.targets import prompted
    from vit_explorer.models.builtin import EXAMPLES
    from vit_explorer.web.captions import model_summary

    model, _ = shapes_clip
    for lines in ("", "  \n \t\n"):
        assert prompted(model, lines) is model
        assert "box above is empty, so there is nothing to predict" in model_summary(analyze(model, EXAMPLES / "01-star.png",
                                                                                              explain=False))
