import numpy as np
import pytest
import torch

from vit_explorer import VitExplorerError, attention_rollout
from vit_explorer.core.rollout import discard_lowest, fuse_heads, rollout_factors, rollout_row, rollout_rows


def random_attention(layers=4, heads=3, n=7, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(layers, heads, n, n, generator=generator) * 2, dim=-1)


def test_rollout_matches_a_hand_computed_three_layer_example():
    a1 = [[1.0, 0.0], [0.5, 0.5]]
    a2 = [[0.5, 0.5], [0.0, 1.0]]
    a3 = [[0.2, 0.8], [0.6, 0.4]]
    attentions = torch.tensor([a1, a2, a3])[:, None]  # [3 layers, 1 head, 2, 2]
    # Â = ½A + ½I: Â1 = [[1, 0], [.25, .75]], Â2 = [[.75, .25], [0, 1]], Â3 = [[.6, .4], [.3, .7]]; R = Â3·Â2·Â1
    expected = torch.tensor([[0.5875, 0.4125], [0.41875, 0.58125]])
    torch.testing.assert_close(attention_rollout(attentions), expected)
    # from layer 1 on: Â3·Â2 = [[.45, .55], [.225, .775]]
    torch.testing.assert_close(attention_rollout(attentions, start_layer=1), torch.tensor([[0.45, 0.55], [0.225, 0.775]]))


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
@pytest.mark.parametrize("discard", [0.0, 0.3, 0.8])
def test_rollout_rows_sum_to_one(fusion, discard):
    result = attention_rollout(random_attention(), head_fusion=fusion, discard_ratio=discard)
    torch.testing.assert_close(result.sum(-1), torch.ones(7))
    assert (result >= 0).all()


def test_rows_are_normalised_over_keys_not_queries():
    # max fusion gives rows that do not sum to one; dividing by the column sums (a known bug) breaks this
    factors = rollout_factors(random_attention(layers=1, heads=4), head_fusion="max", residual_weight=0.0)
    fused = fuse_heads(random_attention(layers=1, heads=4), "max")
    torch.testing.assert_close(factors, fused / fused.sum(-1, keepdim=True))
    assert not torch.allclose(factors.sum(-2), torch.ones(7))


def test_identity_attention_gives_identity():
    identity = torch.eye(5).expand(3, 2, 5, 5)
    torch.testing.assert_close(attention_rollout(identity), torch.eye(5))
    torch.testing.assert_close(attention_rollout(identity, residual_weight=0.0, discard_ratio=0.5), torch.eye(5))


def test_discard_never_drops_the_class_column():
    attentions = random_attention(layers=1, heads=1)
    attentions[..., 0] = 1e-6  # the class column is the smallest of every row
    attentions = attentions / attentions.sum(-1, keepdim=True)
    kept = discard_lowest(fuse_heads(attentions), 0.9)
    assert (kept[..., 0] > 0).all()
    assert int((kept[0] == 0).sum(-1)[0]) == int(7 * 0.9)


def test_one_row_path_equals_the_full_product_row():
    attentions = random_attention(layers=6, n=11, seed=4)
    for options in [{}, {"head_fusion": "max", "discard_ratio": 0.5, "start_layer": 2, "residual_weight": 0.3}]:
        full = attention_rollout(attentions, **options)
        for query in (0, 5, 10):
            torch.testing.assert_close(rollout_row(attentions, query, **options), full[query])
    factors = rollout_factors(attentions)
    mean_query = torch.full((1, 11), 1 / 11)
    torch.testing.assert_close(rollout_rows(factors, mean_query)[0], attention_rollout(attentions).mean(0))


def test_rollout_widens_float16_and_refuses_numpy_with_the_conversion():
    attentions = random_attention()
    result = attention_rollout(attentions.half())
    assert result.dtype == torch.float32 and result.shape == (7, 7)
    torch.testing.assert_close(result, attention_rollout(attentions), atol=2e-3, rtol=0)
    with pytest.raises(VitExplorerError, match=r"torch.from_numpy\(array\)"):
        attention_rollout(attentions.numpy().astype(np.float16))


@pytest.mark.parametrize(
    "kwargs, message",
    [({"head_fusion": "median"}, "head_fusion"), ({"discard_ratio": 1.0}, "discard_ratio"), ({"start_layer": 4}, "start_layer"),
     ({"residual_weight": 2.0}, "residual_weight")],
)
def test_bad_options_are_user_errors(kwargs, message):
    with pytest.raises(VitExplorerError, match=message):
        attention_rollout(random_attention(), **kwargs)
