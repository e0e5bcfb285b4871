"""High-norm artefact tokens (Darcet et al. 2023, "Vision Transformers Need Registers").

Large ViTs repurpose a few low-information patches as scratch space: from some middle layer on, those
tokens' residual stream is many times the norm of the other patches, and they draw much of the
attention, which makes attention maps look noisy. Registers are extra prefix tokens meant to take
that role. ``capture`` records the norm of every token after every layer in the same pass as the
attention (``Analysis.token_norms``); this module flags the outliers and measures the attention they
receive.

The rule, per layer, over that layer's patch tokens only:

    norm > median + k · σ̂,   σ̂ = max(1.4826 · MAD, 0.01 · median),   k = 6

* Median and MAD (median absolute deviation) are not moved by the outliers they are looking for (a
  50% breakdown point), whereas a mean and standard deviation would be pulled up by the very tokens
  to be found, most of all where there are many of them.
* 1.4826 · MAD estimates the standard deviation of normally distributed values, so k = 6 is a
  six-sigma rule: for normal norms about one patch in 10⁹ would pass, none of a 37 × 37 grid. Patch
  norms have heavier tails than a normal distribution, and k = 6 leaves room for them, while the
  artefacts Darcet et al. describe lie at several times the median norm, far beyond the threshold.
* The floor on σ̂ keeps a layer whose patches are all alike (MAD 0, e.g. a blank image) from
  flagging float noise.

Prefix tokens (class, distillation, registers) are never flagged: they are reported by name, with
their norm and attention share beside the patches' median.

The attention share of a token in a layer is the mean over heads and over all queries of the layer's
attention landing on it, so the shares of all tokens of a layer sum to 1. The share of the flagged
tokens in layer l uses the tokens flagged at layer l's output: once an artefact token appears it stays
high-norm in the layers above, so this pairing differs from the layer's input only at the layer
where a token first turns into an outlier.

Everything here is torch, like the norms and maps it reads (``Analysis.token_norms``, ``Analysis.attentions``).
"""

from __future__ import annotations

import torch

from vit_explorer.core.analysis import Analysis, memo
from vit_explorer.core.token_norms import MAD_SCALE, NORM_SPREAD_FLOOR, K, TokenNorms, most_flagged_layer
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.layout import TokenLayout


def median(values: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The median along ``dim``: for an even count the mean of the two middle values, as the rule (module doc)
    means it (``torch.median`` returns the lower one)."""
    ordered = values.sort(dim=dim).values
    count = values.shape[dim]
    return (ordered.select(dim, (count - 1) // 2) + ordered.select(dim, count // 2)) / 2


def outlier_thresholds(patch_norms: torch.Tensor, k: float = K) -> tuple[torch.Tensor, torch.Tensor]:
    """The median and the outlier threshold of each layer ``[layers]`` from patch norms ``[layers, patches]``."""
    middle = median(patch_norms, dim=1)  # [layers]
    mad = median((patch_norms - middle[:, None]).abs(), dim=1)  # [layers]
    spread = torch.maximum(MAD_SCALE * mad, NORM_SPREAD_FLOOR * middle)
    return middle, middle + k * spread


def flag_patches(norms: torch.Tensor, layout: TokenLayout, k: float = K) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each layer's median patch norm and outlier threshold ``[layers]``, and the flagged tokens ``[layers, n]`` (patches
    above the threshold; prefix tokens never), from the token norms ``[layers, n]``."""
    patches = norms.float()[:, layout.num_prefix_tokens:]  # [layers, patches]
    middle, threshold = outlier_thresholds(patches, k)
    flagged = torch.zeros(norms.shape, dtype=torch.bool)  # [layers, n]
    flagged[:, layout.num_prefix_tokens:] = patches > threshold[:, None]
    return middle, threshold, flagged


def peak_layer(analysis: Analysis, k: float = K) -> int:
    """``TokenNorms.peak_layer`` from the token norms alone, without the attention they are measured against."""
    if analysis.token_norms is None:
        raise VitExplorerError("this analysis was made without token norms; analyse the image again")
    return most_flagged_layer(flag_patches(analysis.token_norms, analysis.layout, k)[2])


def token_norms(norms: torch.Tensor, received: torch.Tensor, layout: TokenLayout, k: float = K) -> TokenNorms:
    """Flag the high-norm patches of every layer and measure their attention.

    ``norms`` ``[layers, n]`` are token norms after each layer, ``received`` ``[layers, n]`` the attention
    share of each token (``received_attention``), ``k`` the rule's k (module doc).
    """
    if norms.shape != received.shape or norms.shape[-1] != layout.num_tokens:
        raise ValueError(f"norms {norms.shape} and attention shares {received.shape} must both be [layers, {layout.num_tokens}]")
    if not k > 0:
        raise VitExplorerError(f"k must be positive, not {k}")
    norms = norms.float()
    prefix = layout.num_prefix_tokens
    middle, threshold, flagged = flag_patches(norms, layout, k)
    return TokenNorms(
        layout=layout, norms=norms, flagged=flagged, k=float(k), threshold=threshold, patch_median=middle, received=received,
        flagged_attention_share=torch.where(flagged, received, 0.0).sum(dim=1),
        patch_median_share=median(received[:, prefix:], dim=1),
        prefix={name: {"norm": norms[:, token], "attention_share": received[:, token]} for token,
                name in enumerate(layout.prefix_names)},
    )


def for_analysis(analysis: Analysis, k: float = K) -> TokenNorms:
    """``token_norms`` of an analysis, from the norms and maps of its one pass (kept on the analysis)."""
    if analysis.token_norms is None:
        raise VitExplorerError("this analysis was made without token norms; analyse the image again")

    shares = analysis.store.received_attention()
    return memo(analysis, ("token_norms", float(k)), lambda: token_norms(analysis.token_norms, shares, analysis.layout, k))
