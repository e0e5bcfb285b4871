"""The shipped model against ground truth: real weights, real capture, no mocked maps.

Two sets: the training generator's own held-out images, and an independent set drawn by other code
(``independent_shapes``: skimage, HSV colours, backgrounds the generator never makes), never used for
training or tuning. Photos must be flagged as outside what the model knows.
"""

import numpy as np
import pytest
from independent_shapes import independent_set
from PIL import Image, ImageDraw

from vit_explorer import analyze, load_model
from vit_explorer.core import maps
from vit_explorer.core.analysis import class_evidence
from vit_explorer.methods.evaluation import evaluate_on_shapes
from vit_explorer.models import DEFAULT_MODEL
from vit_explorer.shapes.generator import CLASSES, draw_shape
from vit_explorer.shapes.train import heldout_faithfulness, heldout_figures

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shapes_model():
    return load_model(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def figures(shapes_model):
    return heldout_figures(shapes_model, count=200)


@pytest.fixture(scope="module")
def independent():
    return independent_set(200)


@pytest.fixture(scope="module")
def independent_figures(shapes_model, independent):
    return evaluate_on_shapes(shapes_model, independent)


def test_shipped_model_loads_with_its_layout_and_labels(shapes_model):
    assert shapes_model.labels == list(CLASSES)
    assert shapes_model.layout.grid_hw == (16, 16) and shapes_model.layout.prefix_names == ("cls",)
    assert shapes_model.preprocess.input_hw == (256, 256)


# The floors below are the shipped model's measured figures less a margin (issue 12's targets are 0.95 and
# 0.90 accuracy and 0.9 pointing; the held-out accuracy is below its target, and the README says so). Chance is 1/6.


def test_classifies_held_out_shapes(figures):
    # measured 0.955 on these 200; 0.942 on generate_set's 1,000 and 0.925 on the training's own 1,000 (target 0.95)
    assert figures.accuracy >= 0.91


def test_classifies_shapes_drawn_by_independent_code(independent_figures):
    assert independent_figures.accuracy >= 0.93  # measured 0.98 on these 200, 0.984 on 1,000


@pytest.mark.parametrize("method,held_out_floor,independent_floor", [("rollout", 0.90, 0.95), ("relevance", 0.92, 0.95)])
def test_maps_point_at_the_object_on_both_sets(figures, independent_figures, method, held_out_floor, independent_floor):
    assert figures.pointing[method] >= held_out_floor  # measured 0.95 (rollout), 0.965 (relevance)
    assert independent_figures.pointing[method] >= independent_floor  # measured 0.99, 0.995
    for measured in (figures, independent_figures):
        assert measured.pointing[method] > measured.pointing["random"] + 0.5


def test_class_specific_maps_point_at_least_as_well_as_rollout(figures):
    for method in ("relevance", "grad-rollout"):
        assert figures.pointing[method] >= figures.pointing["rollout"], method


def test_attention_mass_concentrates_on_the_object(figures):
    # rollout mixes in the identity at every layer, so it spreads more than one layer's attention does
    assert figures.energy["rollout"] >= 1.8 * figures.target_share  # measured 2.17×
    assert figures.energy["cls"] >= 3.3 * figures.target_share  # measured 3.94×
    for method in ("relevance", "grad-rollout"):
        assert figures.energy[method] >= 3.0 * figures.target_share, method  # measured 3.46× and 3.41×


def test_relevance_beats_random_orders_at_deletion_and_insertion(shapes_model):
    figures = heldout_faithfulness(shapes_model, count=40, methods=("relevance",))
    relevance, chance = figures.auc["relevance"], figures.auc["random"]
    assert relevance["deletion"] < chance["deletion"] - 0.2  # measured 0.191 against 0.564
    assert relevance["insertion"] > chance["insertion"] + 0.15  # measured 0.791 against 0.556


def two_shapes() -> Image.Image:
    """A yellow square on the left and a cyan circle on the right, the model unsure between them."""
    picture = np.full((256, 256, 3), (70, 80, 90), dtype=np.uint8)
    for kind, centre_x, colour in (("square", 64, (230, 200, 60)), ("circle", 192, (60, 220, 230))):
        mask = Image.new("L", (256, 256), 0)
        draw_shape(ImageDraw.Draw(mask), kind, centre_x, 128, 40, 0.0)
        picture[np.asarray(mask) > 0] = colour
    return Image.fromarray(picture)


def test_the_target_class_moves_the_map_to_its_object(shapes_model):
    analysis = analyze(shapes_model, two_shapes())
    assert {"square", "circle"} <= {prediction.label for prediction in analysis.top_k(3)}
    for method in ("relevance", "grad-rollout"):
        left_share = {}
        for target in ("square", "circle"):
            grid_map = maps.class_map(analysis, method, class_evidence(shapes_model, analysis, target, (method,)),
                                      maps.RolloutOptions())
            left_share[target] = grid_map[:, :8].sum() / grid_map.sum()
        assert left_share["square"] > left_share["circle"] + 0.2, (method, left_share)  # measured 0.57 and 0.12


def test_every_example_is_predicted_as_its_name_says_unless_it_says_it_is_a_hard_case(shapes_model):
    """The examples are, per class, the generator's first image (seed 2026) that the model gets right, and any first image it
    got wrong, kept as ``NN-class-hard-case.png`` (measured: the star, small on a checkerboard, called a cross at 30%)."""
    from vit_explorer.models.builtin import EXAMPLES
    from vit_explorer.shapes.generator import CLASSES, example_class
    from vit_explorer.web.app import hard_cases_note

    examples = sorted(EXAMPLES.glob("*.png"))
    named = [example_class(path) for path in examples]
    assert sorted(name for name, hard in named if not hard) == sorted(CLASSES)
    hard_ones = []
    for path, (name, hard) in zip(examples, named, strict=True):
        predicted = analyze(shapes_model, path).top_k(1)[0].label
        assert (predicted != name) == hard, (path.name, predicted)
        hard_ones += [name] if hard else []
    # after the others
    assert examples[-len(hard_ones):] == [path for path, (_, hard) in zip(examples, named, strict=True) if hard]
    note = hard_cases_note(examples)
    assert all(f"(a {name})" in note for name in hard_ones) and ("wrong" in note) == bool(hard_ones)


def test_write_examples_keeps_the_first_right_image_and_the_first_miss_as_a_hard_case(tmp_path):
    from vit_explorer.shapes.generator import example_class, write_examples

    plain = write_examples(tmp_path / "plain")  # no model: the first image of each class, numbered as they appear
    firsts = [(np.asarray(Image.open(path)), example_class(path)[0]) for path in plain]

    def predict_stars_wrong_once(image):
        """Right on each class's first image but the star's; a later image is asked about only while the star is missing."""
        for first, name in firsts:
            if np.array_equal(image, first):
                return "cross" if name == "star" else name
        return "star"

    checked = write_examples(tmp_path / "checked", predict=predict_stars_wrong_once)
    names = [path.name for path in checked]
    assert len(checked) == 7 and names[-1] == "06-star-hard-case.png", names
    star_number = next(path.name[:2] for path in plain if "star" in path.name)
    assert f"{star_number}-star.png" in names  # the same place as before, a later star the model gets right
    hard = Image.open(checked[-1])
    assert np.array_equal(np.asarray(hard), np.asarray(Image.open(plain[int(star_number)])))  # the first star itself
    for path in plain:
        if "star" not in path.name:  # every other class's first image is kept as it was
            assert np.array_equal(np.asarray(Image.open(tmp_path / "checked" / path.name)), np.asarray(Image.open(path)))


def test_a_photo_under_the_built_in_model_says_what_the_model_knows(shapes_model, tmp_path, capsys):
    """The energy score cannot flag photos this model confidently calls "ring" (astronaut -3.0, chelsea -3.1, coffee
    -3.5 against a threshold of -2.02: measured and settled), so every prediction carries the model's domain."""
    from vit_explorer.cli import main
    from vit_explorer.web.captions import model_summary

    data = pytest.importorskip("skimage.data")
    for name in ("astronaut", "chelsea", "coffee"):
        analysis = analyze(shapes_model, Image.fromarray(getattr(data, name)()), explain=False)
        line = "knows only six synthetic shapes (circle, square, triangle, star, cross, ring)"
        assert line in model_summary(analysis).split("\n")[0], name  # on the prediction's own line
        Image.fromarray(getattr(data, name)()).save(tmp_path / f"{name}.png")
        assert main(["analyze", str(tmp_path / f"{name}.png"), "--out", str(tmp_path / name), "--no-faithfulness"]) == 0
        assert line in capsys.readouterr().err, name


def test_textures_and_text_that_look_like_no_shape_are_flagged(shapes_model):
    """Pictures the model is unsure about (no class above 30%): measured 8 of these 8 flagged, with little margin."""
    data = pytest.importorskip("skimage.data")
    names = ("brick", "grass", "gravel", "immunohistochemistry", "logo", "moon", "page", "text")
    flagged = [analyze(shapes_model, Image.fromarray(getattr(data, name)()), explain=False).ood.flagged for name in names]
    assert sum(flagged) >= 6, dict(zip(names, flagged, strict=True))


def test_few_independent_shapes_are_flagged(shapes_model, independent):
    flagged = [analyze(shapes_model, Image.fromarray(drawn.image)).ood.flagged for drawn in independent]
    assert np.mean(flagged) <= 0.05
