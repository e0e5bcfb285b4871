"""One head's queries and keys in one 2-D picture (AttentionViz: Yeh et al., IEEE VIS 2023).

A head attends from query i to key j by ``softmax_j(q_i · k_j)``. Plotting its queries and keys together puts a query
near the keys it attends to only once the two clouds share a centre and a scale, so both are moved first, as AttentionViz
does, in ways that keep every attention weight:

* **scaling**: queries times ``s`` and keys divided by ``s`` leave every ``q · k`` unchanged; ``s`` is chosen so that
  queries and keys have the same mean norm;
* **translation**: the keys are moved by ``c`` so that their centroid is the (scaled) queries' centroid. This adds
  ``q_i · c`` to every logit of query i, the same for all its keys, so each row's softmax is unchanged.

The moved queries and keys (``[2n, head_dim]``) are then projected to 2-D together, by PCA (``torch.linalg.svd``) or
t-SNE (scikit-learn's ``TSNE``, where installed). A projection distorts distances, t-SNE more than PCA (it keeps
neighbourhoods, not distances or directions); a head's logits may also have an additive term (relative-position bias, a
mask) that no point shows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from vit_explorer.errors import VitExplorerError

PROJECTIONS = {"pca": "PCA (torch.linalg.svd)", "tsne": "t-SNE (scikit-learn)"}


@dataclass(frozen=True)
class JointEmbedding:
    """One head's queries and keys projected together.

    Attributes:
        queries: each token's query in 2-D ``[n, 2]``.
        keys: each token's key in 2-D ``[n, 2]``.
        projection: which projection made them (a value of ``PROJECTIONS``).
        scale: the factor on the queries (the keys are divided by it) before the translation.
        explained: PCA's share of the moved points' variance on each of its two axes; None for t-SNE.
        agreement: ``neighbour_agreement`` of the picture with the head's own map; None where not measured.
        biased: the head's logits have an additive term (relative-position bias, a mask) that no point shows.
    """

    queries: torch.Tensor
    keys: torch.Tensor
    projection: str
    scale: float
    explained: tuple[float, float] | None
    agreement: float | None = None
    biased: bool = False


def shared_frame(queries: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Queries ``[n, d]`` and keys ``[n, d]`` scaled to one mean norm and the keys moved onto the queries' centroid
    (module doc): each row of ``softmax(queries' @ keys'ᵀ)`` equals that of ``softmax(queries @ keysᵀ)``. Returns the moved
    queries, the moved keys and the scale ``s``."""
    queries, keys = queries.double(), keys.double()
    scale = float((keys.norm(dim=-1).mean() / queries.norm(dim=-1).mean().clamp_min(1e-12)).sqrt())
    queries, keys = queries * scale, keys / scale
    keys = keys + (queries.mean(dim=0) - keys.mean(dim=0))
    return queries, keys, scale


def principal_axes(points: torch.Tensor) -> tuple[torch.Tensor, tuple[float, float]]:
    """``points`` ``[m, d]`` on their first two principal axes ``[m, 2]`` (sign fixed so that each axis's largest
    coordinate is positive), and the share of their variance on each."""
    centred = points - points.mean(dim=0)
    _, singular, axes = torch.linalg.svd(centred, full_matrices=False)
    projected = centred @ axes[:2].T
    signs = torch.sign(projected.gather(0, projected.abs().argmax(dim=0, keepdim=True)))
    variance = singular**2
    shares = (variance[:2] / variance.sum().clamp_min(1e-30)).tolist()
    return projected * signs, (shares[0], shares[1] if len(shares) > 1 else 0.0)


def tsne(points: torch.Tensor, seed: int) -> torch.Tensor:
    """scikit-learn's t-SNE of ``points`` ``[m, d]`` to ``[m, 2]``, initialised by PCA (so that one seed gives one
    picture). 500 iterations, not scikit-learn's 1000: on a 197-token head that halves the time (0.61 s instead of 1.08 s
    on 2 cores) and moves the ``neighbour_agreement`` by about one point (benchmarks/query_key_view.py)."""
    try:
        from sklearn.manifold import TSNE
    except ImportError:
        raise VitExplorerError("t-SNE needs scikit-learn: pip install 'vit-explorer[projection]', or use PCA") from None
    perplexity = min(30.0, (len(points) - 1) / 3)
    embedded = TSNE(n_components=2, perplexity=perplexity, init="pca", max_iter=500,
                    random_state=seed).fit_transform(points.numpy())
    return torch.from_numpy(embedded).double()


def projected(queries: torch.Tensor, keys: torch.Tensor, projection: str, seed: int) -> JointEmbedding:
    """Queries ``[m, d]`` and keys ``[m, d]`` after ``shared_frame``, projected together by ``projection``; no agreement
    measured (it depends on which keys each query is scored against)."""
    if projection not in PROJECTIONS:
        raise VitExplorerError(f"unknown projection {projection!r}; choose one of {', '.join(PROJECTIONS)}")
    moved_queries, moved_keys, scale = shared_frame(queries, keys)
    points = torch.cat([moved_queries, moved_keys])  # [2m, d]
    if projection == "pca":
        flat, explained = principal_axes(points)
    else:
        flat, explained = tsne(points, seed), None
    count = len(queries)
    return JointEmbedding(queries=flat[:count].float(), keys=flat[count:].float(), projection=PROJECTIONS[projection],
                          scale=scale, explained=explained)


def joint_embedding(queries: torch.Tensor, keys: torch.Tensor, projection: str = "pca", seed: int = 0,
                    bias: torch.Tensor | None = None) -> JointEmbedding:
    """One head's queries ``[n, d]`` and keys ``[n, d]`` (scaled as ``AttentionInputs`` keeps them) in one 2-D embedding,
    after ``shared_frame``, with its ``neighbour_agreement`` with the head's map ``softmax(queries @ keysᵀ + bias)``
    (``bias`` broadcastable to ``[n, n]``, or None)."""
    embedding = projected(queries, keys, projection, seed)
    logits = queries.double() @ keys.double().T
    attention = torch.softmax(logits if bias is None else logits + bias.double(), dim=-1)  # [n, n]
    return replace(embedding, agreement=neighbour_agreement(embedding, attention), biased=bias is not None)


def sample_embedding(queries: torch.Tensor, keys: torch.Tensor, projection: str = "pca", seed: int = 0) -> JointEmbedding:
    """One head's queries and keys over a sample of images ``[images, n, d]`` each, moved by one ``shared_frame`` (which
    keeps every image's attention weights: the translation adds a constant to each query's logits) and projected
    together: ``queries`` and ``keys`` of the result are ``[images · n, 2]``, image by image. Its agreement is the mean of
    each image's own (its queries against its own keys)."""
    images, tokens, width = queries.shape
    embedding = projected(queries.reshape(images * tokens, width), keys.reshape(images * tokens, width), projection, seed)
    agreements = [neighbour_agreement(
        replace(embedding, queries=embedding.queries[image * tokens : (image + 1) * tokens],
                keys=embedding.keys[image * tokens : (image + 1) * tokens]),
        torch.softmax(queries[image].double() @ keys[image].double().T, dim=-1)) for image in range(images)]
    return replace(embedding, agreement=sum(agreements) / images)


def neighbour_agreement(embedding: JointEmbedding, attention: torch.Tensor, nearest: int = 5) -> float:
    """How far the picture can be read as "a query lies near the keys it attends to": the share of queries whose
    most-attended key (``attention`` ``[n, n]``, the head's map) is among the ``nearest`` keys closest to the query in
    the embedding. A share near ``nearest / n`` is what a picture unrelated to the attention gives."""
    distances = torch.cdist(embedding.queries.double(), embedding.keys.double())  # [n, n]
    closest = distances.topk(min(nearest, distances.shape[1]), dim=1, largest=False).indices
    favourite = attention.argmax(dim=1, keepdim=True)
    return float((closest == favourite).any(dim=1).double().mean())
