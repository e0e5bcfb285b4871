"""TextSpan (Gandelsman, Efros and Steinhardt, ICLR 2024, "Interpreting CLIP's image representation via text-based
decomposition"): a head described by the texts whose directions its outputs vary along most.

A head's direct outputs over a set of images, in the joint image-text space, are ``data`` ``[images, dim]``. The
text bank's embeddings ``[texts, dim]`` are first projected onto the span of the data's top ``rank`` right singular
vectors (the directions the head can write). Then, ``iters`` times: the text whose projection varies most across the
images (the largest standard deviation of data · text) is chosen, and its direction is removed from the data and from
every text, so that the next choice explains what is left. This follows the authors' ``replace_with_iterative_removal``
(``compute_complete_text_set.py`` of ``yossigandelsman/clip_text_span``, MIT licence) step by step: the same
mean-centring, the same projection, the same order of operations, float32 as theirs.

One difference, on purpose. Their reconstruction starts as ``einops.repeat`` of the mean row, a view whose rows share
one row of memory; on their GPU ``.cpu()`` copies it densely, but run on the CPU ``.cpu().numpy()`` keeps the shared
row, so each ``reconstruct += …`` adds every image's projection into the same row and all rows come out equal. Here
the reconstruction is what the paper defines and their GPU run computes: each image's mean-centred output projected
on the chosen directions in turn, plus the mean. The chosen texts are theirs exactly.

What it shows is the bank's nearest directions to what a head writes directly, not the head's meaning: a description
the bank lacks cannot be chosen, and what the head writes that later layers transform (its indirect effect) is not in
``data``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vit_explorer.errors import VitExplorerError


@torch.no_grad()
def text_span(data: np.ndarray, text_features: np.ndarray, texts: Sequence[str], iters: int,
              rank: int) -> tuple[np.ndarray, list[str]]:
    """The ``iters`` texts of ``texts`` that explain most of the variance of a head's outputs ``data`` ``[N, D]`` (one
    row per image), chosen in turn from the bank's embeddings ``text_features`` ``[T, D]`` projected onto the rank-``rank``
    span of ``data``, and the per-image reconstruction ``[N, D]`` float32 of ``data`` from the chosen directions (the
    mean plus each image's projections). Module doc: the authors' algorithm, and where the reconstruction differs from
    their code run on a CPU."""
    data, text_features = np.asarray(data), np.asarray(text_features)
    if data.ndim != 2 or text_features.ndim != 2 or data.shape[1] != text_features.shape[1]:
        raise VitExplorerError(f"text_span takes data [images, dim] and text features [texts, dim] of one dim, not "
                               f"{list(data.shape)} and {list(text_features.shape)}")
    if len(texts) != text_features.shape[0]:
        raise VitExplorerError(f"{len(texts)} texts for {text_features.shape[0]} text features")
    if not 0 < iters <= len(texts) or not 0 < rank <= min(data.shape):
        raise VitExplorerError(f"iters must be in 1..{len(texts)} (the texts) and rank in 1..{min(data.shape)} (the smaller "
                               f"side of data), not {iters} and {rank}")
    _, _, vh = np.linalg.svd(data, full_matrices=False)
    vh = vh[:rank]  # [rank, D]: the directions the head writes along most
    # the bank projected onto that span, as the authors write it (vh's rows are orthonormal, so this is vhᵀ·vh)
    projected = vh.T.dot(np.linalg.inv(vh.dot(vh.T)).dot(vh)).dot(text_features.T).T  # [T, D]
    centred = torch.from_numpy(data).float()
    mean = centred.mean(dim=0, keepdim=True)  # [1, D]
    centred = centred - mean  # [N, D]
    reconstruction = mean.repeat(centred.shape[0], 1)  # [N, D], one row per image
    bank = torch.from_numpy(projected).float()  # [T, D]
    chosen = []
    for _ in range(iters):
        spread = (centred @ bank.T).std(dim=0)  # [T]: each text's projection's standard deviation over the images
        top = int(np.argmax(spread.numpy()))
        chosen.append(texts[top])
        direction = bank[top]
        squared = direction @ direction
        along = (centred @ direction / squared)[:, None] * direction[None, :]  # [N, D]
        reconstruction += along
        centred = centred - along
        bank = bank - (bank @ direction / squared)[:, None] * direction[None, :]
    return reconstruction.numpy(), chosen
