import pytest
import torch
from conftest import TINY, make_vit

from vit_explorer.models.vit import ViT

vit_pytorch = pytest.importorskip("vit_pytorch")


@pytest.mark.parametrize(
    "config",
    [
        TINY,
        {**TINY, "pool": "mean"},
        {**TINY, "image_size": (64, 48), "patch_size": (16, 8)},
        {**TINY, "heads": 1, "dim_head": 32},  # no output projection, as in vit-pytorch
    ],
    ids=["cls", "mean-pool", "rectangular", "one-head"],
)
def test_vit_pytorch_state_dict_loads_strict_and_gives_same_logits(config):
    torch.manual_seed(1)
    theirs = vit_pytorch.ViT(**config).eval()
    ours = ViT(**config).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    images = torch.randn(2, 3, *ours.image_size)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), theirs(images), rtol=0, atol=0)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}


def test_rectangular_image_has_rectangular_grid():
    model = make_vit({**TINY, "image_size": (256, 192), "patch_size": 16})
    assert model.grid_size == (16, 12)
    assert model.pos_embedding.shape == (16 * 12 + 1, TINY["dim"])
    assert model(torch.randn(1, 3, 256, 192)).shape == (1, TINY["num_classes"])


def test_indivisible_image_size_is_refused():
    with pytest.raises(ValueError, match="not divisible"):
        ViT(**{**TINY, "image_size": 70})
