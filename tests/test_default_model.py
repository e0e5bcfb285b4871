"""The shipped model against the generator's ground truth: real weights, real capture, no mocked maps."""

import pytest

from vit_explorer import analyze, load_model
from vit_explorer.evaluation import heldout_figures
from vit_explorer.models import DEFAULT_MODEL
from vit_explorer.shapes import CLASSES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shapes_model():
    return load_model(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def figures(shapes_model):
    return heldout_figures(shapes_model, count=200)


def test_shipped_model_loads_with_its_layout_and_labels(shapes_model):
    assert shapes_model.labels == list(CLASSES)
    assert shapes_model.layout.grid_hw == (16, 16) and shapes_model.layout.prefix_names == ("cls",)
    assert shapes_model.preprocess.input_hw == (256, 256)


def test_classifies_held_out_shapes(figures):
    assert figures.accuracy >= 0.95


def test_class_token_rollout_points_at_the_object(figures):
    assert figures.pointing_rollout >= 0.90
    assert figures.pointing_rollout > figures.pointing_random + 0.5


def test_attention_mass_concentrates_on_the_object(figures):
    # rollout mixes in the identity at every layer, so it spreads more than one layer's attention does
    assert figures.energy_rollout >= 1.6 * figures.target_share
    assert figures.energy_last_layer >= 3 * figures.target_share


def test_examples_are_analysed_and_predicted_right(shapes_model):
    from vit_explorer.models.builtin import ASSETS

    examples = sorted((ASSETS / "examples").glob("*.png"))
    assert len(examples) >= 6
    for path in examples:
        expected = path.stem.split("-", 1)[1]
        assert analyze(shapes_model, path).top_k(1)[0].label == expected, path.name
