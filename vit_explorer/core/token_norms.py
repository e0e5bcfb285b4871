"""Token norms and the high-norm patches they flag (Darcet et al., 2023): the rule, its constants, and ``TokenNorms``,
the flagged patches of every layer with the attention they draw (``methods.norms`` computes it)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from vit_explorer.models.layout import TokenLayout

K = 6.0  # σ̂ above the median that flags a patch (module doc)
MAD_SCALE = 1.4826  # MAD → standard deviation of normal data
NORM_SPREAD_FLOOR = 0.01  # σ̂ is at least this share of the median

# Darcet et al.'s artefacts lie many times the median norm and draw far more attention than a patch's share
ARTEFACT_NORM = 3.0  # at least this many times the layer's median patch norm
ARTEFACT_SHARE = 3.0  # and at least this many times the layer's median patch attention share
RULE = "norm > median + k · max(1.4826 · MAD, 0.01 · median) over the layer's patch tokens"
SHARE = "mean over heads and queries of the layer's attention landing on the token(s); a layer's tokens sum to 1"


def most_flagged_layer(flagged: torch.Tensor) -> int:
    """The layer with the most flagged patches in ``flagged`` ``[layers, n]`` (the last of them on a tie; the last layer
    when none is flagged)."""
    counts = flagged.sum(dim=1)
    return flagged.shape[0] - 1 - int(counts.flip(0).argmax())


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
        """The layer with the most flagged patches (``most_flagged_layer``)."""
        return most_flagged_layer(self.flagged)

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
            return (f"patch tokens above the outlier rule (k = {self.k:g}) in layers {layers}, "
                    f"{int(self.flagged.any(dim=0).sum())} distinct, at {measured}: not artefacts in Darcet et al.'s sense "
                    f"(those lie ≥ {ARTEFACT_NORM:g}× the median and draw ≥ {ARTEFACT_SHARE:g}× a patch's share)")
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
                                "norm_over_median": float(relative[layer, token]),
                                "attention_share": float(self.received[layer, token]),
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
            "artefact_rule": f"flagged, norm ≥ {ARTEFACT_NORM:g}× the median and attention share ≥ {ARTEFACT_SHARE:g}× "
                             "the median patch's",
            "grid": list(self.layout.grid_hw), "prefix_names": list(self.layout.prefix_names),
                "num_tokens": self.layout.num_tokens,
            "summary": self.summary(),
            "layers": layers,
            "prefix": {name: {key: values.tolist() for key, values in token.items()} for name, token in self.prefix.items()},
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, ensure_ascii=False) + "\n"


# the smallest spread, in the curves' own unit (a probability, or a share of the image's score), that counts as one: below
