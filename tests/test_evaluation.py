import numpy as np
import torch

from vit_explorer.methods.evaluation import mask_energy, patch_mask, pointing_hit


def test_patch_mask_marks_touched_patches_and_dilates_by_one():
    mask = np.zeros((64, 64), dtype=bool)
    mask[20:22, 36:38] = True  # inside patch (1, 2) of a 4×4 grid of 16-pixel patches
    touched = patch_mask(mask, (4, 4), dilate=0)
    assert touched.sum() == 1 and touched[1, 2]
    grown = patch_mask(mask, (4, 4), dilate=1)
    assert grown.sum() == 9 and grown[0:3, 1:4].all()
    corner = np.zeros((64, 64), dtype=bool)
    corner[0, 0] = True
    assert patch_mask(corner, (4, 4)).sum() == 4  # clipped at the border, not wrapped round


def test_pointing_and_energy():
    target = torch.zeros(4, 4, dtype=torch.bool)
    target[1, 2] = True
    grid_map = torch.zeros(4, 4, dtype=torch.float64)
    grid_map[1, 2], grid_map[3, 3] = 0.6, 0.4
    assert pointing_hit(grid_map, target)
    assert not pointing_hit(-grid_map, target)
    assert mask_energy(grid_map, target) == 0.6
    assert mask_energy(torch.ones(4, 4), target) == 1 / 16


def test_a_batch_of_known_and_unknown_labels_explains_each_image_for_its_own_target():
    from vit_explorer import load_model
    from vit_explorer.core.analysis import class_evidence
    from vit_explorer.methods.evaluation import Labelled, sample_analyses
    from vit_explorer.shapes.generator import generate_set

    model = load_model("builtin:shapes")
    samples = generate_set(5, 2)
    mixed = [Labelled(samples[0].image, -1), Labelled(samples[1].image, (samples[1].label + 1) % 6)]
    for sample, analysis, evidence in sample_analyses(model, mixed):
        expected = int(analysis.logits.argmax()) if sample.label < 0 else sample.label
        alone = class_evidence(model, analysis, expected)  # its own forward and backward pass for that class
        assert evidence.target == expected
        torch.testing.assert_close(evidence.weighted, alone.weighted, atol=1e-5, rtol=1e-4)
