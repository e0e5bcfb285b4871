import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy

from vit_explorer.core.statistics import (
    attention_entropy,
    mean_attention_distance,
    patch_distances,
    prefix_share,
    ranks,
    spearman,
)
from vit_explorer.models.layout import TokenLayout

LAYOUT = TokenLayout(("cls",), (3, 3), (16, 16))


def attention_with(rows: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(rows, dtype=torch.float32)[None, None]  # [1 layer, 1 head, n, n]


def test_entropy_is_zero_for_one_hot_and_log_n_for_uniform():
    n = LAYOUT.num_tokens
    assert attention_entropy(attention_with(np.eye(n)))[0, 0] == pytest.approx(0.0, abs=1e-6)
    assert attention_entropy(attention_with(np.full((n, n), 1 / n)))[0, 0] == pytest.approx(np.log(n), rel=1e-5)


def test_mean_distance_is_zero_for_self_attention_and_in_pixels_otherwise():
    n = LAYOUT.num_tokens
    assert mean_attention_distance(attention_with(np.eye(n)), LAYOUT)[0, 0] == pytest.approx(0.0)
    # every patch looks only at its right neighbour (or left on the last column): 16 pixels away
    rows = np.zeros((n, n))
    for token in range(1, n):
        r, c = LAYOUT.token_patch(token)
        rows[token, LAYOUT.patch_token(r, c + 1 if c < 2 else c - 1)] = 1.0
    rows[0, 0] = 1.0
    assert mean_attention_distance(attention_with(rows), LAYOUT)[0, 0] == pytest.approx(16.0)
    assert patch_distances(LAYOUT)[0, 8].item() == pytest.approx(np.hypot(32, 32))


def test_prefix_share_counts_attention_on_prefix_tokens_from_patch_queries():
    n = LAYOUT.num_tokens
    rows = np.full((n, n), 0.5 / (n - 1))
    rows[:, 0] = 0.5
    assert prefix_share(attention_with(rows), LAYOUT)[0, 0] == pytest.approx(0.5)
    no_prefix = TokenLayout((), (3, 3), (16, 16))
    assert prefix_share(torch.full((1, 1, 9, 9), 1 / 9), no_prefix)[0, 0] == 0.0


def test_spearman_matches_pearson_of_hand_ranks_with_ties():
    values = torch.tensor([[3.0, 1.0], [3.0, 7.0]])
    assert ranks(values).tolist() == [1.5, 0.0, 1.5, 3.0]  # the two 3s share ranks 1 and 2
    rng = np.random.default_rng(0)
    first, second = rng.normal(size=50), rng.normal(size=50)
    hand_first, hand_second = first.argsort().argsort(), second.argsort().argsort()  # no ties in normal draws
    first, second = torch.from_numpy(first), torch.from_numpy(second)
    assert spearman(first, second) == pytest.approx(np.corrcoef(hand_first, hand_second)[0, 1])
    assert spearman(first, first.exp()) == pytest.approx(1.0) and spearman(first, -first) == pytest.approx(-1.0)
    assert np.isnan(spearman(first, torch.ones(50)))


def test_entropy_matches_scipy_on_rows_with_exact_zeros():
    rng = np.random.default_rng(5)
    rows = rng.dirichlet(np.full(9, 0.3), size=(2, 3, 9)).astype(np.float32)  # [layers, heads, n, n]
    rows[..., :2] = 0.0  # softmax underflow leaves exact zeros, which contribute nothing
    rows /= rows.sum(axis=-1, keepdims=True)
    expected = scipy_entropy(rows.astype(np.float64), axis=-1).mean(axis=-1)  # [layers, heads]
    from_tensor = attention_entropy(torch.from_numpy(rows))
    assert isinstance(from_tensor, torch.Tensor) and not torch.isnan(from_tensor).any()
    np.testing.assert_allclose(from_tensor.numpy(), expected, rtol=1e-5)


def test_head_statistics_in_groups_match_each_statistic_over_the_whole_batch(monkeypatch):
    from vit_explorer.core import statistics

    layout = TokenLayout(("cls", "reg1"), (4, 5), (16, 16))
    maps = torch.softmax(torch.randn(3, 2, 4, layout.num_tokens, layout.num_tokens) * 2, dim=-1)  # [b, layers, heads, n, n]
    expected = {
        "entropy": torch.special.entr(maps).sum(-1).mean(-1),  # the textbook form, not the grouped one
        "distance": mean_attention_distance(maps, layout),
        "prefix share": maps[..., 2:, :2].sum(-1).mean(-1),
    }
    monkeypatch.setattr(statistics, "GROUP_BYTES", 3 * layout.num_tokens**2 * 4)  # groups of 3 maps: 24 maps in 8 groups
    together = statistics.head_statistics(maps, layout)
    assert list(together) == list(statistics.HEAD_STATISTICS)
    for name, values in together.items():
        assert values.shape == (3, 2, 4)
        torch.testing.assert_close(values, expected[name], rtol=1e-5, atol=1e-6)

