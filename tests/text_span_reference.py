"""The authors' TextSpan, transcribed for the tests: ``replace_with_iterative_removal`` of ``compute_complete_text_set.py``
in ``yossigandelsman/clip_text_span`` (MIT licence, Copyright (c) 2024 Yossi Gandelsman), line for line, run on the CPU.

``dense`` adds the one ``.copy()`` that their GPU run gets from ``.cpu()``: without it, on the CPU, the reconstruction
is a view whose rows share one row of memory (``einops.repeat``), and every image's projection is added into it."""

import einops
import numpy as np
import torch


@torch.no_grad()
def replace_with_iterative_removal(data, text_features, texts, iters, rank, device="cpu", dense=True):
    results = []
    u, s, vh = np.linalg.svd(data, full_matrices=False)
    vh = vh[:rank]
    text_features = (
        vh.T.dot(np.linalg.inv(vh.dot(vh.T)).dot(vh)).dot(text_features.T).T
    )  # Project the text to the span of W_OV
    data = torch.from_numpy(data).float().to(device)
    mean_data = data.mean(dim=0, keepdim=True)
    data = data - mean_data
    reconstruct = einops.repeat(mean_data, "A B -> (C A) B", C=data.shape[0])
    reconstruct = reconstruct.detach().cpu().numpy()
    if dense:
        reconstruct = reconstruct.copy()
    text_features = torch.from_numpy(text_features).float().to(device)
    for i in range(iters):  # noqa: B007 (their line, as they wrote it)
        projection = data @ text_features.T
        projection_std = projection.std(axis=0).detach().cpu().numpy()
        top_n = np.argmax(projection_std)
        results.append(texts[top_n])
        text_norm = text_features[top_n] @ text_features[top_n].T
        reconstruct += (
            (
                (data @ text_features[top_n] / text_norm)[:, np.newaxis]
                * text_features[top_n][np.newaxis, :]
            )
            .detach()
            .cpu()
            .numpy()
        )
        data = data - (
            (data @ text_features[top_n] / text_norm)[:, np.newaxis]
            * text_features[top_n][np.newaxis, :]
        )
        text_features = (
            text_features
            - (text_features @ text_features[top_n] / text_norm)[:, np.newaxis]
            * text_features[top_n][np.newaxis, :]
        )
    return reconstruct, results
