"""Class-specific maps: Chefer relevance against a step-by-step reference, gradient-weighted rollout, head importance."""

import numpy as np
import pytest
import torch

from vit_explorer import VitExplorerError
from vit_explorer.core.capture import record_attention_gradients
from vit_explorer.core.relevance import (
    grad_rollout_factors,
    layer_evidence,
    relevance,
    relevance_factors,
    weighted_attention,
)
from vit_explorer.core.rollout import rollout_factors, rollout_rows


def reference_relevance(attentions: np.ndarray, gradients: np.ndarray) -> np.ndarray:
    """Chefer, Gur & Wolf (2021), Eq. 10–11, written out one layer, head and entry at a time."""
    layers, heads, n, _ = attentions.shape
    result = np.eye(n)
    for layer in range(layers):
        mean_positive = np.zeros((n, n))
        for head in range(heads):
            for i in range(n):
                for j in range(n):
                    mean_positive[i, j] += max(gradients[layer, head, i, j] * attentions[layer, head, i, j], 0.0) / heads
        update = np.zeros((n, n))
        for i in range(n):
            for j in range(n):
                update[i, j] = sum(mean_positive[i, k] * result[k, j] for k in range(n))
        result = result + update
    return result


@pytest.fixture
def captured(tiny_vit):
    torch.manual_seed(3)
    _, attentions, gradients = record_attention_gradients(tiny_vit, torch.randn(1, 3, 64, 64), torch.tensor([2]))
    return attentions[0], gradients[0]


def test_relevance_equals_the_step_by_step_reference_on_a_tiny_model(captured):
    attentions, gradients = captured
    expected = reference_relevance(attentions.double().numpy(), gradients.double().numpy())
    np.testing.assert_allclose(relevance(attentions, gradients).numpy(), expected, rtol=1e-4, atol=1e-7)
    # the map is a row of R, and the O(layers·n²) row chain gives the same row as the full matrix
    query = torch.zeros(1, attentions.shape[-1])
    query[0, 0] = 1.0
    row = rollout_rows(relevance_factors(weighted_attention(attentions, gradients)), query)[0]
    np.testing.assert_allclose(row.numpy(), expected[0], rtol=1e-4, atol=1e-7)


def test_weighted_attention_keeps_only_what_raises_the_score():
    attentions = torch.tensor([[[[0.5, 0.5], [0.2, 0.8]]], [[[0.9, 0.1], [0.3, 0.7]]]]).repeat(1, 2, 1, 1)  # [2, 2, 2, 2]
    gradients = torch.ones_like(attentions)
    gradients[:, 1] = -1.0  # the second head's attention lowers the score everywhere
    np.testing.assert_allclose(weighted_attention(attentions, gradients).numpy(), attentions[:, 0].numpy() / 2)
    # a head's importance Σ|∇A ⊙ A| ignores the sign: both heads of each layer count 2, the one that lowers it too
    _, importance = layer_evidence(attentions, gradients)
    np.testing.assert_allclose(importance.numpy(), [[2.0, 2.0], [2.0, 2.0]])
    with pytest.raises(VitExplorerError, match="differ in shape"):
        weighted_attention(attentions, gradients[:1])


def test_grad_rollout_is_rollout_of_the_weighted_maps_and_survives_all_zero_layers(captured):
    attentions, gradients = captured
    weighted = weighted_attention(attentions, gradients)
    factors = grad_rollout_factors(weighted, discard_ratio=0.2)
    torch.testing.assert_close(factors, rollout_factors(weighted[:, None], discard_ratio=0.2))
    torch.testing.assert_close(factors.sum(-1), torch.ones(factors.shape[:2]))
    silent = grad_rollout_factors(torch.zeros_like(weighted))  # no attention helps the class: residual path only
    torch.testing.assert_close(silent, torch.eye(weighted.shape[-1]).expand_as(silent))


def test_gradients_differ_between_classes(tiny_vit):
    images = torch.randn(1, 3, 64, 64)
    _, _, first = record_attention_gradients(tiny_vit, images, torch.tensor([0]))
    _, _, second = record_attention_gradients(tiny_vit, images, torch.tensor([1]))
    assert not torch.allclose(first, second)
