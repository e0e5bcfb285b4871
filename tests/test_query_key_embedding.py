"""The joint query–key embedding (AttentionViz): the shared frame keeps every attention weight, the projections are
the libraries' own."""

import pytest
import torch
from conftest import photo

from vit_explorer import VitExplorerError, analyze, load_model
from vit_explorer.core.analysis import queries_and_keys
from vit_explorer.core.map_store import attention_rows
from vit_explorer.core.query_key_embedding import (
    PROJECTIONS,
    joint_embedding,
    neighbour_agreement,
    principal_axes,
    shared_frame,
)


def random_head(n=40, d=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    # keys far off the queries' centre and at another scale: the case the frame exists for
    queries = torch.randn(n, d, generator=generator) * 0.3
    keys = torch.randn(n, d, generator=generator) * 4 + 7
    return queries, keys


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_shared_frame_keeps_every_attention_weight_and_shares_a_centre_and_a_mean_norm(seed):
    queries, keys = random_head(seed=seed)
    moved_queries, moved_keys, scale = shared_frame(queries, keys)
    before = torch.softmax(queries.double() @ keys.double().T, dim=-1)
    after = torch.softmax(moved_queries @ moved_keys.T, dim=-1)
    torch.testing.assert_close(after, before, atol=1e-12, rtol=1e-9)
    torch.testing.assert_close(moved_keys.mean(0), moved_queries.mean(0))
    # the scale equalises the mean norms before the translation
    torch.testing.assert_close((queries.double() * scale).norm(dim=-1).mean(), (keys.double() / scale).norm(dim=-1).mean())
    assert not torch.allclose(moved_keys, keys.double())  # it did move them


def test_pca_gives_numpys_principal_axes_up_to_sign():
    points = torch.randn(60, 8, dtype=torch.float64) * torch.linspace(5, 0.1, 8)
    projected, explained = principal_axes(points)
    centred = (points - points.mean(0)).numpy()
    import numpy as np

    eigenvalues, eigenvectors = np.linalg.eigh(np.cov(centred, rowvar=False))
    order = np.argsort(eigenvalues)[::-1][:2]
    expected = torch.from_numpy(centred @ eigenvectors[:, order])
    torch.testing.assert_close(projected.abs(), expected.abs())
    assert explained == pytest.approx(tuple(eigenvalues[order] / eigenvalues.sum()))


def test_tsne_is_scikit_learns_and_puts_each_query_nearest_the_keys_it_attends_to_more_often_than_chance():
    pytest.importorskip("sklearn")
    # two groups of tokens whose queries attend within their group: the embedding should keep the groups apart
    generator = torch.Generator().manual_seed(3)
    centres = torch.randn(2, 16, generator=generator) * 3
    group = torch.arange(40) % 2
    queries = centres[group] + 0.3 * torch.randn(40, 16, generator=generator)
    keys = centres[group] + 0.3 * torch.randn(40, 16, generator=generator)
    embedding = joint_embedding(queries, keys, "tsne")
    assert embedding.projection == PROJECTIONS["tsne"] and embedding.explained is None
    distances = torch.cdist(embedding.queries.double(), embedding.keys.double())
    assert (group[distances.argmin(dim=1)] == group).float().mean() == 1.0


def test_an_unknown_projection_is_a_user_error():
    queries, keys = random_head()
    with pytest.raises(VitExplorerError, match="unknown projection 'umap'"):
        joint_embedding(queries, keys, "umap")


def test_a_model_that_kept_its_maps_records_its_queries_and_keys_once_and_they_give_its_maps(tiny_checkpoint):
    tiny_model = load_model(str(tiny_checkpoint))
    analysis = analyze(tiny_model, photo())
    assert analysis.queries_keys is None  # a classifier within the budget keeps its maps whole
    inputs = queries_and_keys(tiny_model, analysis)
    assert queries_and_keys(tiny_model, analysis) is inputs  # memoised
    for layer in range(tiny_model.map_shape[0]):
        derived = attention_rows(inputs.queries[layer], inputs.keys[layer].float().transpose(-2, -1), inputs.biases[layer], 0)
        torch.testing.assert_close(derived, analysis.attentions[layer], atol=1e-6, rtol=0)
    embedding = joint_embedding(inputs.queries[0, 0], inputs.keys[0, 0])
    assert embedding.queries.shape == embedding.keys.shape == (analysis.layout.num_tokens, 2)


def test_neighbour_agreement_counts_queries_whose_favourite_key_is_near_them():
    from vit_explorer.core.query_key_embedding import JointEmbedding, neighbour_agreement

    # queries and keys on one line, key i at query i, the gaps growing (0, 1, 3, 6, 10, 15): no ties among distances
    line = torch.tensor([0.0, 1, 3, 6, 10, 15])[:, None] * torch.tensor([[1.0, 0.0]])
    embedding = JointEmbedding(queries=line, keys=line.clone(), projection="test", scale=1.0, explained=None)
    own = torch.eye(6)  # every query attends to its own key: the nearest one
    assert neighbour_agreement(embedding, own, nearest=1) == 1.0
    far = torch.eye(6).flip(1)  # query i attends to key 5 - i, never its own
    assert neighbour_agreement(embedding, far, nearest=1) == 0.0
    # with two nearest keys (its own and the closer neighbour), only query 3 (at 6) has its favourite (key 2, at 3) there
    assert neighbour_agreement(embedding, far, nearest=2) == pytest.approx(1 / 6)


def test_a_sample_is_moved_by_one_frame_that_keeps_each_images_weights_and_scores_each_image_on_its_own_keys():
    from vit_explorer.core.query_key_embedding import sample_embedding

    queries = torch.stack([random_head(seed=seed)[0] for seed in range(3)])  # [3, n, d]
    keys = torch.stack([random_head(seed=seed)[1] for seed in range(3)])
    embedding = sample_embedding(queries, keys)
    assert embedding.queries.shape == embedding.keys.shape == (3 * 40, 2)
    moved_queries, moved_keys, _ = shared_frame(queries.reshape(-1, 16), keys.reshape(-1, 16))
    for image in range(3):
        rows = slice(image * 40, (image + 1) * 40)
        before = torch.softmax(queries[image].double() @ keys[image].double().T, dim=-1)
        torch.testing.assert_close(torch.softmax(moved_queries[rows] @ moved_keys[rows].T, dim=-1), before, atol=1e-12,
                                   rtol=1e-9)
    own = []
    for image in range(3):
        rows = slice(image * 40, (image + 1) * 40)
        part = type(embedding)(embedding.queries[rows], embedding.keys[rows], "", 1.0, None)
        own.append(neighbour_agreement(part, torch.softmax(queries[image].double() @ keys[image].double().T, dim=-1)))
    assert embedding.agreement == pytest.approx(sum(own) / 3)
