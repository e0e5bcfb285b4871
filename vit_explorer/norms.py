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
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from .analysis import Analysis, memo
from .errors import VitExplorerError
from .layout import TokenLayout

K = 6.0  # σ̂ above the median that flags a patch (module doc)
MAD_SCALE = 1.4826  # MAD → standard deviation of normal data
SPREAD_FLOOR = 0.01  # σ̂ is at least this share of the median
RULE = "norm > median + k · max(1.4826 · MAD, 0.01 · median) over the layer's patch tokens"
SHARE = "mean over heads and queries of the layer's attention landing on the token(s); a layer's tokens sum to 1"


def outlier_thresholds(patch_norms: np.ndarray, k: float = K) -> tuple[np.ndarray, np.ndarray]:
    """The median and the outlier threshold of each layer ``[layers]`` from patch norms ``[layers, patches]``."""
    median = np.median(patch_norms, axis=1)  # [layers]
    mad = np.median(np.abs(patch_norms - median[:, None]), axis=1)  # [layers]
    spread = np.maximum(MAD_SCALE * mad, SPREAD_FLOOR * median)
    return median, median + k * spread


def received_attention(attentions: np.ndarray) -> np.ndarray:
    """Mean attention each token receives ``[layers, n]`` (over heads and queries), from maps
    ``[layers, heads, n, n]`` or head means ``[layers, n, n]``."""
    axes = (1, 2) if attentions.ndim == 4 else (1,)
    return attentions.mean(axis=axes, dtype=np.float32)


@dataclass(frozen=True)
class TokenNorms:
    """Token norms of one analysis and the high-norm outliers among its patches.

    Attributes:
        layout: the token layout (prefix tokens, then the patch grid).
        norms: L2 norm of every token after each layer ``[layers, n]``.
        flagged: patch tokens above the layer's threshold ``[layers, n]`` bool (prefix columns always False).
        k: the rule's k (module doc).
        threshold: the norm above which a patch is flagged ``[layers]``.
        patch_median: median norm of the patches ``[layers]``.
        received: attention share of every token ``[layers, n]`` (module doc).
        flagged_attention_share: attention share of the flagged tokens together ``[layers]``.
        patch_median_share: median attention share of one patch ``[layers]``.
        prefix: for each prefix token by name, its ``norm`` and ``attention_share`` ``[layers]``.
    """

    layout: TokenLayout
    norms: np.ndarray
    flagged: np.ndarray
    k: float
    threshold: np.ndarray
    patch_median: np.ndarray
    received: np.ndarray
    flagged_attention_share: np.ndarray
    patch_median_share: np.ndarray
    prefix: dict[str, dict[str, np.ndarray]]

    @property
    def num_layers(self) -> int:
        return self.norms.shape[0]

    def flagged_tokens(self, layer: int) -> np.ndarray:
        """Sequence indices of the patches flagged in ``layer`` ``[flagged]``."""
        return np.flatnonzero(self.flagged[layer])

    @property
    def peak_layer(self) -> int:
        """The layer with the most flagged patches (the last of them on a tie; the last layer when none is flagged)."""
        counts = self.flagged.sum(axis=1)
        return int(self.num_layers - 1 - np.argmax(counts[::-1]))

    @property
    def relative(self) -> np.ndarray:
        """Each token's norm over its layer's median patch norm ``[layers, n]``."""
        return self.norms / np.maximum(self.patch_median, np.finfo(np.float32).tiny)[:, None]

    def summary(self) -> str:
        """One line: how many patches are flagged, where, and the attention they draw."""
        counts = self.flagged.sum(axis=1)
        if not counts.any():
            return f"no high-norm patch tokens in any layer (k = {self.k:g})"
        layers = np.flatnonzero(counts)
        peak = int(np.argmax(self.flagged_attention_share))
        ratio = self.relative[self.flagged].max()
        return (f"high-norm patch tokens (k = {self.k:g}) in layers {', '.join(str(layer) for layer in layers)}: "
                f"up to {counts.max()} per layer, {np.any(self.flagged, axis=0).sum()} distinct, up to {ratio:.1f}× the median norm; "
                f"they draw at most {self.flagged_attention_share[peak]:.1%} of the attention (layer {peak})")

    def as_dict(self) -> dict:
        """Everything but the full ``[layers, n]`` arrays, as JSON-ready numbers (norms and shares per layer)."""
        relative = self.relative
        layers = []
        for layer in range(self.num_layers):
            flagged = []
            for token in self.flagged_tokens(layer).tolist():
                row, col = self.layout.token_patch(token)
                flagged.append({"token": token, "row": row, "col": col, "norm": float(self.norms[layer, token]),
                                "norm_over_median": float(relative[layer, token]), "attention_share": float(self.received[layer, token])})
            layers.append({
                "layer": layer,
                "patch_median_norm": float(self.patch_median[layer]),
                "threshold": float(self.threshold[layer]),
                "max_patch_norm": float(self.norms[layer, self.layout.num_prefix_tokens:].max()),
                "flagged_attention_share": float(self.flagged_attention_share[layer]),
                "median_patch_attention_share": float(self.patch_median_share[layer]),
                "flagged": flagged,
            })
        return {
            "rule": RULE, "k": self.k, "attention_share": SHARE,
            "grid": list(self.layout.grid_hw), "prefix_names": list(self.layout.prefix_names), "num_tokens": self.layout.num_tokens,
            "summary": self.summary(),
            "layers": layers,
            "prefix": {name: {key: [float(value) for value in values] for key, values in token.items()} for name, token in self.prefix.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, ensure_ascii=False) + "\n"


def token_norms(norms: np.ndarray, received: np.ndarray, layout: TokenLayout, k: float = K) -> TokenNorms:
    """Flag the high-norm patches of every layer and measure their attention.

    ``norms`` ``[layers, n]`` are token norms after each layer, ``received`` ``[layers, n]`` the attention
    share of each token (``received_attention``), ``k`` the rule's k (module doc).
    """
    if norms.shape != received.shape or norms.shape[-1] != layout.num_tokens:
        raise ValueError(f"norms {norms.shape} and attention shares {received.shape} must both be [layers, {layout.num_tokens}]")
    if not k > 0:
        raise VitExplorerError(f"k must be positive, not {k}")
    norms = np.asarray(norms, dtype=np.float32)
    prefix = layout.num_prefix_tokens
    patches = norms[:, prefix:]  # [layers, patches]
    median, threshold = outlier_thresholds(patches, k)
    flagged = np.zeros(norms.shape, dtype=bool)  # [layers, n]
    flagged[:, prefix:] = patches > threshold[:, None]
    return TokenNorms(
        layout=layout, norms=norms, flagged=flagged, k=float(k), threshold=threshold, patch_median=median, received=received,
        flagged_attention_share=np.where(flagged, received, 0.0).sum(axis=1),
        patch_median_share=np.median(received[:, prefix:], axis=1),
        prefix={name: {"norm": norms[:, token], "attention_share": received[:, token]} for token, name in enumerate(layout.prefix_names)},
    )


def for_analysis(analysis: Analysis, k: float = K) -> TokenNorms:
    """``token_norms`` of an analysis, from the norms and maps of its one pass (kept on the analysis)."""
    if analysis.token_norms is None:
        raise VitExplorerError("this analysis was made without token norms; analyse the image again")

    def received() -> np.ndarray:
        maps = analysis.attentions if analysis.attentions is not None else analysis.compact["head_mean"]
        return received_attention(maps)

    shares = memo(analysis, ("received_attention",), received)
    return memo(analysis, ("token_norms", float(k)), lambda: token_norms(analysis.token_norms, shares, analysis.layout, k))
