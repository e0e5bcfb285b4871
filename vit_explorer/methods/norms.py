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

import json
from dataclasses import dataclass

import torch

from vit_explorer.core.analysis import Analysis, memo
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.layout import TokenLayout

K = 6.0  # σ̂ above the median that flags a patch (module doc)
MAD_SCALE = 1.4826  # MAD → standard deviation of normal data
SPREAD_FLOOR = 0.01  # σ̂ is at least this share of the median
# Darcet et al.'s artefacts lie many times the median norm and draw far more attention than a patch's share
ARTEFACT_NORM = 3.0  # at least this many times the layer's median patch norm
ARTEFACT_SHARE = 3.0  # and at least this many times the layer's median patch attention share
RULE = "norm > median + k · max(1.4826 · MAD, 0.01 · median) over the layer's patch tokens"
SHARE = "mean over heads and queries of the layer's attention landing on the token(s); a layer's tokens sum to 1"


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
    spread = torch.maximum(MAD_SCALE * mad, SPREAD_FLOOR * middle)
    return middle, middle + k * spread


def received_attention(attentions: torch.Tensor) -> torch.Tensor:
    """Mean attention each token receives ``[layers, n]`` float32 (over heads and queries), from maps
    ``[layers, heads, n, n]`` or head means ``[layers, n, n]``."""
    dims = (1, 2) if attentions.ndim == 4 else (1,)
    return attentions.mean(dim=dims, dtype=torch.float32)


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
    norms: torch.Tensor
    flagged: torch.Tensor
    k: float
    threshold: torch.Tensor
    patch_median: torch.Tensor
    received: torch.Tensor
    flagged_attention_share: torch.Tensor
    patch_median_share: torch.Tensor
    prefix: dict[str, dict[str, torch.Tensor]]

    @property
    def num_layers(self) -> int:
        return self.norms.shape[0]

    def flagged_tokens(self, layer: int) -> torch.Tensor:
        """Sequence indices of the patches flagged in ``layer`` ``[flagged]``."""
        return self.flagged[layer].nonzero().flatten()

    @property
    def peak_layer(self) -> int:
        """The layer with the most flagged patches (the last of them on a tie; the last layer when none is flagged)."""
        counts = self.flagged.sum(dim=1)
        return self.num_layers - 1 - int(counts.flip(0).argmax())

    @property
    def relative(self) -> torch.Tensor:
        """Each token's norm over its layer's median patch norm ``[layers, n]``."""
        return self.norms / self.patch_median.clamp_min(torch.finfo(torch.float32).tiny)[:, None]

    @property
    def share_ratio(self) -> torch.Tensor:
        """Each token's attention share over its layer's median patch share ``[layers, n]``: 1 is a typical patch."""
        return self.received / self.patch_median_share.clamp_min(torch.finfo(torch.float32).tiny)[:, None]

    @property
    def artefacts(self) -> torch.Tensor:
        """Flagged patches that behave like Darcet et al.'s artefacts ``[layers, n]`` bool: at least
        ``ARTEFACT_NORM`` times the median norm and drawing at least ``ARTEFACT_SHARE`` times a typical patch's
        attention. A patch merely above the outlier rule (k σ̂ over the median) may be neither."""
        return self.flagged & (self.relative >= ARTEFACT_NORM) & (self.share_ratio >= ARTEFACT_SHARE)

    def summary(self) -> str:
        """One line: where patches pass the outlier rule, how far above the median norm they lie, the attention
        each draws against a typical patch's share, and whether that makes them artefacts (``artefacts``)."""
        counts = self.flagged.sum(dim=1)
        if not counts.any():
            return f"no high-norm patch tokens in any layer (k = {self.k:g})"
        layers = ", ".join(str(layer) for layer in counts.nonzero().flatten().tolist())
        norm_ratio, share_ratio = self.relative[self.flagged], self.share_ratio[self.flagged]
        measured = (f"{norm_ratio.min():.1f}–{norm_ratio.max():.1f}× the median patch norm, each drawing "
                    f"{share_ratio.min():.1f}–{share_ratio.max():.1f}× a typical patch's attention share")
        artefacts = self.artefacts
        if not artefacts.any():
            return (f"patch tokens above the outlier rule (k = {self.k:g}) in layers {layers}, {int(self.flagged.any(dim=0).sum())} "
                    f"distinct, at {measured}: not artefacts in Darcet et al.'s sense (those lie ≥ {ARTEFACT_NORM:g}× the median "
                    f"and draw ≥ {ARTEFACT_SHARE:g}× a patch's share)")
        peak = int(torch.where(artefacts, self.received, 0.0).sum(dim=1).argmax())
        artefact_layers = ", ".join(str(layer) for layer in artefacts.any(dim=1).nonzero().flatten().tolist())
        return (f"high-norm artefact tokens (Darcet et al. 2023) in layers {artefact_layers}: {int(artefacts.any(dim=0).sum())} "
                f"distinct; all tokens above the outlier rule (k = {self.k:g}, layers {layers}) lie at {measured}; the artefacts "
                f"draw {float(torch.where(artefacts, self.received, 0.0)[peak].sum()):.1%} of the attention in layer {peak}")

    def as_dict(self) -> dict:
        """Everything but the full ``[layers, n]`` arrays, as JSON-ready numbers (norms and shares per layer)."""
        relative = self.relative
        layers = []
        for layer in range(self.num_layers):
            flagged = []
            for token in self.flagged_tokens(layer).tolist():
                row, col = self.layout.token_patch(token)
                flagged.append({"token": token, "row": row, "col": col, "norm": float(self.norms[layer, token]),
                                "norm_over_median": float(relative[layer, token]), "attention_share": float(self.received[layer, token]),
                                "share_over_median": float(self.share_ratio[layer, token])})
            layers.append({
                "layer": layer,
                "patch_median_norm": float(self.patch_median[layer]),
                "threshold": float(self.threshold[layer]),
                "max_patch_norm": float(self.norms[layer, self.layout.num_prefix_tokens:].max()),
                "flagged_attention_share": float(self.flagged_attention_share[layer]),
                "artefacts": self.artefacts[layer].nonzero().flatten().tolist(),
                "median_patch_attention_share": float(self.patch_median_share[layer]),
                "flagged": flagged,
            })
        return {
            "rule": RULE, "k": self.k, "attention_share": SHARE,
            "artefact_rule": f"flagged, norm ≥ {ARTEFACT_NORM:g}× the median and attention share ≥ {ARTEFACT_SHARE:g}× the median patch's",
            "grid": list(self.layout.grid_hw), "prefix_names": list(self.layout.prefix_names), "num_tokens": self.layout.num_tokens,
            "summary": self.summary(),
            "layers": layers,
            "prefix": {name: {key: values.tolist() for key, values in token.items()} for name, token in self.prefix.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, ensure_ascii=False) + "\n"


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
    patches = norms[:, prefix:]  # [layers, patches]
    middle, threshold = outlier_thresholds(patches, k)
    flagged = torch.zeros(norms.shape, dtype=torch.bool)  # [layers, n]
    flagged[:, prefix:] = patches > threshold[:, None]
    return TokenNorms(
        layout=layout, norms=norms, flagged=flagged, k=float(k), threshold=threshold, patch_median=middle, received=received,
        flagged_attention_share=torch.where(flagged, received, 0.0).sum(dim=1),
        patch_median_share=median(received[:, prefix:], dim=1),
        prefix={name: {"norm": norms[:, token], "attention_share": received[:, token]} for token, name in enumerate(layout.prefix_names)},
    )


def for_analysis(analysis: Analysis, k: float = K) -> TokenNorms:
    """``token_norms`` of an analysis, from the norms and maps of its one pass (kept on the analysis)."""
    if analysis.token_norms is None:
        raise VitExplorerError("this analysis was made without token norms; analyse the image again")

    def received() -> torch.Tensor:
        return received_attention(analysis.store.head_means())

    shares = memo(analysis, ("received_attention",), received)
    return memo(analysis, ("token_norms", float(k)), lambda: token_norms(analysis.token_norms, shares, analysis.layout, k))
