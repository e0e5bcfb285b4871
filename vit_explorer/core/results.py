"""The values the methods produce and drawing reads: faithfulness curves and the perturbation protocol they follow, the
scoreboard, the sanity check's curves, head ablation, token norms and a dataset's head statistics.

Each is plain data with the arithmetic that reads it (areas, verdicts, rankings, summaries in words); computing one
takes a model and lives in ``methods``. Keeping them here lets ``draw`` turn results into pixels and files without
importing anything that runs a model.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

import torch

from vit_explorer.core import statistics
from vit_explorer.errors import VitExplorerError
from vit_explorer.models.layout import TokenLayout

# what a removed patch shows, by protocol name (``Protocol``)
PROTOCOLS = {
    "blur": "the image blurred over about a patch",
    "mean": "the image's mean colour",
    "road": "ROAD's noisy linear imputation from the neighbouring pixels (Rong et al., ICML 2022)",
}
# a run: one patch order and what happens to its first patches: "delete" (replaced by the protocol's fill, or imputed by
# ROAD) or "insert" (shown on the fill)
Run = tuple[torch.Tensor, str]


@dataclass(frozen=True)
class Protocol:
    """How a map's faithfulness is measured: what a removed patch shows (``PROTOCOLS``) and so what the two curves are.

    Blur and mean: deletion (most important patches replaced first, lower is better) and insertion (put back first on
    the fill, higher is better), scored by insertion − deletion. ROAD: its MoRF (most relevant imputed first) and LeRF
    (least relevant imputed first: a faithful map keeps the score high), scored by (LeRF − MoRF) / 2; its random orders
    stand for both curves, and its imputation draws fresh noise for every image, so no two curves share an image.
    Every word and count that differs between them is read from here, never from a second test of the name."""

    name: str = "blur"

    def __post_init__(self) -> None:
        if self.name not in PROTOCOLS:
            raise VitExplorerError(f"unknown baseline {self.name!r}; use one of {', '.join(PROTOCOLS)}")

    @property
    def imputes(self) -> bool:
        """ROAD: removed patches are imputed from their neighbours, with fresh noise per image."""
        return self.name == "road"

    @property
    def curve_names(self) -> tuple[str, str]:
        """What the two curves are called: deletion and insertion, or ROAD's MoRF and LeRF."""
        return ("MoRF", "LeRF") if self.imputes else ("deletion", "insertion")

    @property
    def description(self) -> str:
        """The protocol in a few words, for progress lines and captions."""
        if self.imputes:
            return "ROAD (MoRF and LeRF; removed patches imputed from their neighbours)"
        return f"{self.name} deletion and insertion"

    @property
    def score_formula(self) -> str:
        first, second = self.curve_names
        return f"({second} − {first}) / 2" if self.imputes else f"{second} − {first}"

    @property
    def axis_title(self) -> str:
        """The x axis of its curves."""
        if self.imputes:
            return "share of patches imputed (MoRF: most relevant first; LeRF: least)"
        return "share of patches deleted / inserted, most important first"

    def combined(self, deletion: float | torch.Tensor, insertion: float | torch.Tensor) -> float | torch.Tensor:
        """The one number a map is ranked by, higher is better: insertion − deletion (ROAD: half that, its combined score)."""
        return (insertion - deletion) / (2 if self.imputes else 1)

    def map_runs(self, order: torch.Tensor) -> list[Run]:
        """A map's two curves: deletion and insertion in ``order``, or ROAD's MoRF and LeRF (the reverse order removed)."""
        return [(order, "delete"), (order.flip(0), "delete")] if self.imputes else [(order, "delete"), (order, "insert")]

    def random_runs(self, orders: list[torch.Tensor]) -> list[Run]:
        """Chance's runs: each random order deleted, then each inserted (ROAD: removed only; they stand for both curves)."""
        return [(order, "delete") for order in orders] + ([] if self.imputes else [(order, "insert") for order in orders])

    def images(self, runs: int, steps: int) -> int:
        """Distinct images ``runs`` curves of ``steps`` steps put through the model: with blur or mean every curve starts
        and ends on the image or the fill, which go through once, so (steps − 1) per curve and those 2; ROAD's imputation
        draws fresh noise for each image, so all steps + 1."""
        return runs * (steps + 1) if self.imputes else runs * (steps - 1) + 2

    def runs_of(self, maps: int, random_orders: int) -> int:
        """Curves that ``maps`` maps and ``random_orders`` random orders take (``map_runs``, ``random_runs``)."""
        return 2 * maps + random_orders * (1 if self.imputes else 2)


BLUR, MEAN, ROAD = Protocol("blur"), Protocol("mean"), Protocol("road")
DEFAULT_STEPS = 16  # steps of one map's faithfulness curves
DEFAULT_RANDOM_ORDERS = 3  # random patch orders that stand for chance
PROBABILITY = "target probability"
SHARE_OF_SCORE = "share of the image's score"  # the measure of a one-output model (module doc)

# shares of the image's score are unreadable where perturbed images score beyond this many times the image's own: the
# reference is then small against what perturbing does (a similarity near 0), and every area is dominated by it
LARGEST_READABLE_SHARE = 5.0


def reference_warning(measure: str, values: torch.Tensor) -> str:
    """Why curves ``[runs, steps + 1]`` of ``measure`` cannot be read as the share of the image's score they claim to be
    (run 0 starts on the unchanged image): its score is negative (lower then means more of it) or small against the
    perturbed images' scores; "" when they can, and always for a probability."""
    if measure != SHARE_OF_SCORE:
        return ""
    if float(values.flatten()[0]) < 0:
        return ("the image's own score is negative, so a share of it flips sign: a falling curve means a rising score. "
                "The areas cannot be judged or ranked; choose a target the image scores positively")
    largest = float(values.abs().max())
    if largest > LARGEST_READABLE_SHARE:
        return (f"perturbed images score up to {largest:.0f}× the image's own score, which is small against what perturbing "
                "does: the areas cannot be judged or ranked; choose a target the image scores clearly")
    return ""


CLEAR_MARGIN = 0.05  # AUC difference from chance below which a map is not called better than random


def fractions_of(steps: int) -> torch.Tensor:
    """The share of patches changed at each step ``[steps + 1]`` float64, 0…1."""
    return torch.linspace(0.0, 1.0, steps + 1, dtype=torch.float64)


def area_under(fractions: torch.Tensor, values: torch.Tensor) -> float:
    """Trapezoidal area under ``values`` ``[steps + 1]`` over ``fractions`` (0…1), in float64."""
    return float(torch.trapezoid(values.double(), fractions.double()))


@dataclass(frozen=True)
class FaithfulnessCurves:
    """Target probability after each step ``[steps + 1]``, for the map's order and for random orders (mean);
    and at each deletion step whether the target is still the top class (1.0 or 0.0; for random orders
    the share of them): over a labelled set, the mean is the accuracy of Chefer et al.'s positive perturbation."""

    target: int
    fractions: torch.Tensor  # [steps + 1] float64: share of patches deleted / inserted at each step, 0…1
    deletion: torch.Tensor  # [steps + 1], and so the other curves
    insertion: torch.Tensor
    random_deletion: torch.Tensor
    random_insertion: torch.Tensor
    deletion_top1: torch.Tensor
    random_deletion_top1: torch.Tensor
    protocol: Protocol = BLUR
    measure: str = PROBABILITY  # what the curves follow: the target's probability, or ``SHARE_OF_SCORE``

    @property
    def curve_names(self) -> tuple[str, str]:
        return self.protocol.curve_names

    @property
    def road_combined(self) -> float | None:
        """ROAD's combined score (AUC_LeRF − AUC_MoRF) / 2, higher is better; None for the other protocols."""
        if not self.protocol.imputes:
            return None
        aucs = self.aucs
        return float(self.protocol.combined(aucs["deletion"], aucs["insertion"]))

    @property
    def aucs(self) -> dict[str, float]:
        """Areas under the four curves: ``deletion`` (lower is better), ``insertion`` (higher is better)."""
        return {name: area_under(self.fractions, getattr(self, name))
                for name in ("deletion", "insertion", "random_deletion", "random_insertion")}

    @property
    def unperturbed(self) -> float:
        """The target's probability on the whole image (the deletion curve before any patch is removed)."""
        return float(self.deletion[0])

    @property
    def relative_aucs(self) -> dict[str, float]:
        """``aucs`` over the unperturbed probability: 1 is as sure as on the whole image, on any model."""
        scale = max(self.unperturbed, torch.finfo(torch.float64).tiny)
        return {name: value / scale for name, value in self.aucs.items()}

    @property
    def margins(self) -> dict[str, float]:
        """How much better than random orders the map is: positive is better, for both curves."""
        aucs = self.aucs
        return {"deletion": aucs["random_deletion"] - aucs["deletion"], "insertion": aucs["insertion"] - aucs["random_insertion"]}

    def beats_chance(self, margin: float = CLEAR_MARGIN) -> bool:
        """Whether the map beats random orders by ``margin`` at both deletion and insertion (never where the curves cannot
        be read, ``warning``)."""
        return not self.warning and min(self.margins.values()) >= margin

    @property
    def warning(self) -> str:
        """Why these curves cannot be judged (``reference_warning``), or ""."""
        return reference_warning(self.measure,
                                 torch.stack([self.deletion, self.insertion, self.random_deletion, self.random_insertion]))

    @property
    def verdict(self) -> str:
        """The verdict in words, as the app and the CLI print it."""
        if self.warning:
            return "cannot be judged"
        return "beats random orders" if self.beats_chance() else f"does not beat random orders by {CLEAR_MARGIN} at both"

    def as_dict(self) -> dict:
        first, second = self.curve_names
        return {"target": self.target, "baseline": self.protocol.name, "measure": self.measure,
                "curves": {"deletion": first, "insertion": second},
                **({"road_combined": self.road_combined} if self.protocol.imputes else {}), "auc": self.aucs,
                "auc_relative_to_unperturbed": self.relative_aucs,
                "unperturbed_probability": self.unperturbed, "margin_over_random": self.margins,
                "beats_chance": self.beats_chance(),
                "warning": self.warning or None,
                **{name: getattr(self, name).round(decimals=6).tolist()
                   for name in ("fractions", "deletion", "insertion", "random_deletion", "random_insertion")}}


FALLEN = 0.5  # a rank correlation below this no longer resembles the trained model's map


@dataclass(frozen=True)
class SanityCurves:
    """How much each map still resembles the trained model's as layers are randomised.

    Attributes:
        methods: the map methods, in order (``maps.CLASS_METHODS`` keys, then any extra ones).
        randomised_layers: how many layers were randomised at each step, ``[0, 1, …, layers]``; 0 is the
            trained model, k the top k layers.
        correlations: per method, the Spearman rank correlation with the trained model's map at each step
            (NaN where a map is constant, which has no ranking).
        target: the class the class-specific maps explain (the trained model's); None for a backbone.
        target_label: its name.
        model_name: the spec the model was loaded from.
        seed: the seed of the random layers.
    """

    methods: tuple[str, ...]
    randomised_layers: list[int]
    correlations: dict[str, list[float]]
    target: int | None
    target_label: str | None
    model_name: str
    seed: int

    @property
    def final(self) -> dict[str, float]:
        """Each method's correlation once every layer is randomised."""
        return {method: values[-1] for method, values in self.correlations.items()}

    def layers_to_fall(self, below: float = FALLEN) -> dict[str, int | None]:
        """Per method, how many layers had to be randomised before its correlation first fell below ``below``;
        None when it never did (the map mostly reflects the input and the layers left trained)."""
        fallen = {}
        for method, values in self.correlations.items():
            steps = [step for step, value in zip(self.randomised_layers, values, strict=True) if value < below]
            fallen[method] = steps[0] if steps else None
        return fallen

    def as_dict(self) -> dict:
        """Plain values; NaN becomes None, so that the dict is valid JSON."""
        record = dataclasses.asdict(self)
        record["methods"] = list(self.methods)
        record["correlations"] = {method: [None if math.isnan(value) else value for value in values]
                                  for method, values in self.correlations.items()}
        record["fallen_below"] = FALLEN
        record["layers_to_fall_below"] = self.layers_to_fall()
        record["summary"] = self.summary()
        return record

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2) + "\n"

    def summary(self) -> str:
        """One line: for each method, how many of the layers had to be randomised before its rank correlation
        with the trained model's map fell below ``FALLEN``, and the correlation with every layer randomised.

        The end point alone hides a map that stays close to the trained one until the last few (lowest)
        layers go: such a map mostly shows the input and the first layers, not what the model learned."""
        layers = self.randomised_layers[-1]
        parts = [f"{method} {'never' if fallen is None else f'{fallen} of {layers}'} "
                 f"(ρ {self.final[method]:.2f} with all {layers})"
                 for method, fallen in self.layers_to_fall().items()]
        return (f"sanity check: layers randomised from the top until the map's Spearman ρ with the trained model's fell below "
                f"{FALLEN}: {'; '.join(parts)}. Few layers: the map depends on what the model learned; most or all, or never: "
                f"it mostly shows the input and the lowest layers")


@dataclass(frozen=True)
class HeadAblation:
    """The effect of removing each head, alone, on one image's target class.

    Attributes:
        mode: one of ``ABLATION_MODES``.
        target: the class index.
        delta_logit: ablated minus original target logit ``[layers, heads]``.
        delta_probability: ablated minus original target probability ``[layers, heads]``.
        original_logit: the target logit with every head in place.
        original_probability: the target probability with every head in place.
        forward_passes: model forward passes it took.
        single_score: the model gives one score (a backbone's similarity target, ``core.targets``), whose softmax is 1
            whatever the heads: heads are then measured by the score itself.
    """

    mode: str
    target: int
    delta_logit: torch.Tensor
    delta_probability: torch.Tensor
    original_logit: float
    original_probability: float
    forward_passes: int
    single_score: bool = False

    @property
    def measure(self) -> str:
        """What a head's drop is a drop of: the target's probability, or its score where it is the only one."""
        return "score" if self.single_score else "probability"

    @property
    def delta(self) -> torch.Tensor:
        """The change of ``measure`` when each head is removed ``[layers, heads]``."""
        return self.delta_logit if self.single_score else self.delta_probability

    @property
    def drop(self) -> torch.Tensor:
        """How much removing each head lowers the target probability (the score, for a single score) ``[layers, heads]``
        (negative: raises it); the "ablation effect" ranking lists heads highest first."""
        return -self.delta

    def ranked(self, k: int | None = None) -> list[tuple[int, int, float]]:
        """The ``k`` heads (all for None) whose removal lowers the target probability most, as (layer, head, drop)."""
        drop = self.drop
        flat = (-drop).flatten().argsort(stable=True)[:k].tolist()
        return [(layer, head, float(drop[layer, head])) for layer, head in (divmod(index, drop.shape[1]) for index in flat)]

    def spearman(self, importance: torch.Tensor) -> float:
        """Spearman correlation of |Δ probability| (|Δ score| for a single score) with a per-head score ``[layers, heads]``
        (gradient importance)."""
        return statistics.spearman(self.delta.abs(), importance)

    def as_dict(self, importance: torch.Tensor | None = None) -> dict:
        """Plain values; with the gradient ``importance`` ``[layers, heads]`` of the same target, also its
        Spearman correlation with |Δ probability| (None where either is constant)."""
        record = {"mode": self.mode, "mode_means": ABLATION_MODES[self.mode], "target": self.target,
                  "original_logit": self.original_logit,
                  "original_probability": self.original_probability, "forward_passes": self.forward_passes,
                  "forward_equivalents": forward_equivalents(*self.delta_logit.shape),
                  "delta_logit": self.delta_logit.round(decimals=7).tolist(),
                  "delta_probability": self.delta_probability.round(decimals=7).tolist(),
                  "ranked_by": self.measure,
                  "ranked_by_drop": [{"layer": layer, "head": head, "drop": drop} for layer, head, drop in self.ranked()]}
        if importance is not None:
            correlation = self.spearman(importance)
            record["spearman_abs_delta_probability_vs_gradient_importance"] = None if math.isnan(correlation) else correlation
        return record

    def to_json(self, importance: torch.Tensor | None = None) -> str:
        return json.dumps(self.as_dict(importance), indent=2) + "\n"


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
# it chance's standard deviation, or the difference between methods, is rounding, and a distance in it means nothing
CHANCE_SPREAD_FLOOR = 1e-3


@dataclass(frozen=True)
class Entry:
    """One method's line of the scoreboard.

    Attributes:
        method: its ``CLASS_METHODS`` key.
        deletion: area under its deletion (ROAD: MoRF) curve, lower is better.
        insertion: area under its insertion (ROAD: LeRF) curve, higher is better.
        score: insertion − deletion (ROAD: half that), higher is better.
        over_chance: score − chance's mean score, in standard deviations of chance's scores (NaN where chance has no
            spread, ``CHANCE_SPREAD_FLOOR``).
        randomised_rho: Spearman ρ of its map with the fully randomised model's (NaN for a constant map).
    """

    method: str
    deletion: float
    insertion: float
    score: float
    over_chance: float
    randomised_rho: float

    @property
    def depends_on_weights(self) -> bool:
        """False when the map survives randomising the whole model (ρ ≥ ``FALLEN``)."""
        return not self.randomised_rho >= FALLEN


@dataclass(frozen=True)
class Scoreboard:
    """The methods of one image and target, best first, and chance's score (mean and spread over random orders); the
    curves follow ``measure``, the target's probability or (a backbone's similarity) the share of the image's score.

    ``unranked`` says why the entries are not ranked (then they stay in method order): every method scores the same,
    or the curves cannot be read (``reference_warning``); "" when they are. ``notes`` says what else a
    reader must know (chance has no spread)."""

    target: int
    target_label: str
    protocol: Protocol
    steps: int
    random_orders: int
    entries: tuple[Entry, ...]
    chance_mean: float
    chance_sd: float
    measure: str = PROBABILITY  # what the curves follow (``faithfulness.measure_of``)
    unranked: str = ""
    notes: tuple[str, ...] = ()

    @property
    def curve_names(self) -> tuple[str, str]:
        return self.protocol.curve_names

    def as_dict(self) -> dict:
        first, second = self.curve_names
        return {"target": self.target, "target_label": self.target_label, "baseline": self.protocol.name, "steps": self.steps,
                "measure": self.measure, "random_orders": self.random_orders, "curves": {"deletion": first, "insertion": second},
                "score": self.protocol.score_formula,
                "chance": {"mean": self.chance_mean, "sd": self.chance_sd}, "sanity_threshold": FALLEN,
                "ranked": not self.unranked, "unranked_because": self.unranked or None, "notes": list(self.notes),
                "ranking": [{"method": entry.method, "deletion": entry.deletion, "insertion": entry.insertion,
                             "score": entry.score,
                             "over_chance_sd": entry.over_chance, "randomised_rho": entry.randomised_rho,
                             "depends_on_weights": entry.depends_on_weights} for entry in self.entries]}


STATISTIC_UNITS = {"entropy": "nats", "distance": "input pixels", "prefix share": "share of attention"}


@dataclass(frozen=True)
class DatasetStatistics:
    """What ``vit-explorer stats`` wrote into a folder, per statistic of ``HEAD_STATISTICS`` and per head
    ``[layers, heads]``: the mean and the 5% and 95% quantiles over the dataset's images."""

    folder: str
    model: str
    source: str
    images: int
    mean: dict[str, torch.Tensor]  # [layers, heads] float64, and so low and high
    low: dict[str, torch.Tensor]
    high: dict[str, torch.Tensor]

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(next(iter(self.mean.values())).shape)

    def outside(self, name: str, values: torch.Tensor) -> list[tuple[int, int, float, float, float]]:
        """The heads whose ``values`` ``[layers, heads]`` (an analysis's, ``maps.ranking_values``) of statistic ``name``
        lie outside the dataset's 5–95% range: (layer, head, value, low, high), furthest outside first (in units of
        the range)."""
        low, high = self.low[name], self.high[name]
        values = values.double()
        beyond = torch.maximum(low - values, values - high) / (high - low).clamp_min(1e-12)  # [layers, heads], > 0 outside
        heads = [(layer, head) for layer, head in (beyond > 0).nonzero().tolist()]
        heads.sort(key=lambda pair: -float(beyond[pair]))
        return [(layer, head, float(values[layer, head]), float(low[layer, head]), float(high[layer, head])) for layer,
                head in heads]


ABLATION_MODES = {
    "zero": "the head's output set to zero",
    "mean": "the head's map replaced by its mean over a reference set (uniform without one)",
}


def forward_equivalents(layers: int, heads: int) -> float:
    """What one ablation costs, in multiples of one plain forward pass of one image: layer evaluations
    (``methods.ablation``'s doc: L + Σ_l (l + H·(L − l))) over the L of one pass. "1 + layers passes" undersells it: each
    branched pass runs H copies of every layer from its branch point up."""
    evaluations = layers + sum(layer + heads * (layers - layer) for layer in range(layers))
    return evaluations / layers


@dataclass(frozen=True)
class Patching:
    """A's target score with one part of its computation taken from B, minus A's own (``methods.patching``).

    Attributes:
        target, label: the target (A's class index, or 0 for a backbone's similarity) and its name.
        score_a, score_b: the target's score on A and on B (the same model, the same target).
        heads: with each head's output at each layer from B ``[layers, heads]``.
        tokens: with the residual stream after each layer at each token from B ``[layers, n]``; None when not asked.
        forward_passes: what it cost, in plain forward passes of one image.
        layout: the token layout ``tokens`` is in (``token_patches`` for the patches).
    """

    target: int
    label: str
    score_a: float
    score_b: float
    heads: torch.Tensor
    tokens: torch.Tensor | None
    forward_passes: float
    layout: TokenLayout

    @property
    def token_patches(self) -> torch.Tensor | None:
        """``tokens`` over the patch grid ``[layers, grid_h, grid_w]``."""
        return None if self.tokens is None else self.layout.patch_map(self.tokens)
