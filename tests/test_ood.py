"""The out-of-distribution score: its math against scipy, its fit, and who sees a notice."""

import json

import numpy as np
import torch
from conftest import CLI_MODEL, far_calibration, photo, write_checkpoint
from scipy.spatial.distance import mahalanobis

from vit_explorer import analyze, load_model
from vit_explorer.captions import model_summary
from vit_explorer.ood import OodCalibration, fit_mahalanobis


def test_scores_are_the_squared_distance_to_the_nearest_class_mean():
    rng = np.random.default_rng(0)
    means = rng.normal(0, 3, (3, 4))
    root = rng.normal(0, 1, (4, 4))
    precision = np.linalg.inv(root @ root.T + np.eye(4))
    calibration = OodCalibration(means, precision, threshold=5.0, known="things")
    features = rng.normal(0, 3, (6, 4))
    expected = [min(mahalanobis(feature, mean, precision) ** 2 for mean in means) for feature in features]
    np.testing.assert_allclose(calibration.scores(features), expected, rtol=1e-10)
    verdict = calibration.verdict(means[1] + 1e-3)
    assert not verdict.flagged and verdict.score < 1e-4


def test_fit_finds_the_class_means_and_a_threshold_that_passes_most_held_out_images():
    """A 'model' whose classifier input is the image's mean colour: three colour classes, then far colours."""

    class MeanColour(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(3, 3)

        def forward(self, pixels):
            return self.head(pixels.mean(dim=(2, 3)))

    rng = np.random.default_rng(1)
    centres = np.array([[40, 40, 200], [200, 40, 40], [40, 200, 40]], dtype=float)
    labels = rng.integers(0, 3, 600)
    colours = centres[labels] + rng.normal(0, 12, (600, 3))
    images = np.clip(colours[:, None, None, :] + np.zeros((1, 4, 4, 3)), 0, 255).astype(np.uint8)

    def to_batch(batch):
        return torch.from_numpy(batch).permute(0, 3, 1, 2).float()

    model = MeanColour()
    config = fit_mahalanobis(model, model.head, to_batch, images[:400], labels[:400], images[400:], known="three colours")
    calibration = OodCalibration.from_config(json.loads(json.dumps(config)))  # survives the trip through the checkpoint's JSON
    np.testing.assert_allclose(np.sort(calibration.means, axis=0), np.sort(centres, axis=0), atol=5)
    held_out = calibration.scores(colours[400:])
    assert np.mean(held_out > calibration.threshold) <= 0.02
    far = np.array([[128, 128, 128], [255, 255, 255], [0, 0, 0]], dtype=float)
    assert calibration.scores(far).min() > 10 * calibration.threshold


def test_a_model_without_calibration_shows_no_notice(tmp_path):
    model = load_model(str(write_checkpoint(tmp_path / "plain.safetensors", CLI_MODEL)))
    analysis = analyze(model, photo((256, 256)))
    assert model.ood is None and analysis.ood is None
    assert "Outside what this model knows" not in model_summary(analysis)


def test_a_calibrated_model_flags_what_lies_far_from_its_classes(tmp_path):
    model = load_model(str(write_checkpoint(tmp_path / "calibrated.safetensors", CLI_MODEL, ood=far_calibration(CLI_MODEL))))
    analysis = analyze(model, photo((256, 256)))
    assert analysis.ood.flagged and analysis.ood.score > 1000  # a normalised feature lies far from 50 in every dimension
    summary = model_summary(analysis)
    assert summary.startswith("> ⚠️ **Outside what this model knows.**") and "nothing real" in summary and "timm:" in summary
