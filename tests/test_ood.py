"""The out-of-distribution score: its math against scipy, its calibration, and who sees a notice."""

import json

import numpy as np
import pytest
import torch
from conftest import CLI_MODEL, flag_all_calibration, photo, write_checkpoint
from scipy.special import logsumexp

from vit_explorer import analyze, load_model
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.ood import OodCalibration, OodVerdict, calibrate, energy
from vit_explorer.web.captions import model_summary


def test_energy_is_minus_logsumexp_of_the_logits():
    logits = np.random.default_rng(0).normal(0, 4, (5, 7))
    energies = energy(torch.from_numpy(logits).float())
    assert isinstance(energies, torch.Tensor)
    np.testing.assert_allclose(energies.numpy(), -logsumexp(logits, axis=1), rtol=1e-6)


def test_calibration_passes_most_held_out_images_and_flags_unsure_logits():
    """Known images: one class logit well above the rest; unfamiliar ones: flat logits, no class stands out."""
    rng = np.random.default_rng(1)
    known = rng.normal(0, 1, (1000, 6))
    known[np.arange(1000), rng.integers(0, 6, 1000)] += rng.normal(8, 1, 1000)
    config = calibrate(torch.from_numpy(known[:500]), known="six things")
    calibration = OodCalibration.from_config(json.loads(json.dumps(config)))  # survives the trip through the checkpoint's JSON
    assert calibration.threshold == pytest.approx(np.quantile(-logsumexp(known[:500], axis=1), 0.99))
    assert np.mean([calibration.verdict(torch.from_numpy(row)).flagged for row in known[500:]]) <= 0.03
    flat = rng.normal(0, 0.3, (50, 6))
    assert all(calibration.verdict(torch.from_numpy(row)).flagged for row in flat)


def test_a_calibration_of_another_kind_is_refused():
    with pytest.raises(VitExplorerError, match="energy"):
        OodCalibration.from_config({"method": "mahalanobis", "means": [[0.0]], "precision": [[1.0]], "threshold": 3.0})


def test_a_model_without_calibration_shows_no_notice(tmp_path):
    model = load_model(str(write_checkpoint(tmp_path / "plain.safetensors", CLI_MODEL)))
    analysis = analyze(model, photo((256, 256)))
    assert model.ood is None and analysis.ood is None
    assert "Outside what this model knows" not in model_summary(analysis)


def test_a_checkpoint_with_an_older_calibration_loads_unflagged_and_says_why(tmp_path):
    older = {"method": "mahalanobis (Lee et al. 2018)", "means": [[0.0]], "precision": [[1.0]], "threshold": 3.0, "known": "x"}
    model = load_model(str(write_checkpoint(tmp_path / "older.safetensors", CLI_MODEL, ood=older)))
    assert model.ood is None and analyze(model, photo((256, 256))).ood is None
    assert any("mahalanobis" in note and "train-default" in note for note in model.notes), model.notes


def test_a_calibrated_model_flags_what_it_is_unsure_of(tmp_path):
    model = load_model(str(write_checkpoint(tmp_path / "calibrated.safetensors", CLI_MODEL, ood=flag_all_calibration())))
    analysis = analyze(model, photo((256, 256)))
    assert analysis.ood.flagged
    assert analysis.ood.score == pytest.approx(-torch.logsumexp(analysis.logits.double(), 0).item())
    summary = model_summary(analysis)
    assert summary.startswith("> ⚠️ **Outside what this model knows.**") and "nothing real" in summary and "timm:" in summary


@pytest.mark.parametrize(("score", "threshold", "said"), [
    (-2.0183, -2.0214, "energy score -2.018 is above -2.021"),  # equal at 2 decimals: one more
    (-1.5, -2.02, "energy score -1.50 is above -2.02"),
])
def test_the_notice_prints_the_digits_that_tell_score_and_threshold_apart(score, threshold, said):
    assert said in OodVerdict(score=score, threshold=threshold, known="shapes").notice("m")
