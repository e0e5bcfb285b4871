"""How a map is judged by perturbing the image: the ``Protocol`` (what a removed patch shows, and so which two curves and
which combined score), the faithfulness curves one map gets under it, and the sanity check's curves (how a map changes
as the model's layers are randomised). Plain data with the arithmetic that reads it; computing them takes a model and
lives in ``methods``."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

import torch

from vit_explorer.errors import VitExplorerError

# what a removed patch shows, by protocol name (``Protocol``)
PROTOCOLS = {
    "blur": "the image blurred over about a patch",
    "mean": "the image's mean colour",
    "road": "ROAD's noisy linear imputation from the neighbouring pixels (Rong et al., ICML 2022)",
}
# a sweep: one patch order and what happens to its first patches: "delete" (replaced by the protocol's fill, or imputed by
# ROAD) or "insert" (shown on the fill)
Sweep = tuple[torch.Tensor, str]


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

    def map_runs(self, order: torch.Tensor) -> list[Sweep]:
        """A map's two curves: deletion and insertion in ``order``, or ROAD's MoRF and LeRF (the reverse order removed)."""
        return [(order, "delete"), (order.flip(0), "delete")] if self.imputes else [(order, "delete"), (order, "insert")]

    def random_runs(self, orders: list[torch.Tensor]) -> list[Sweep]:
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
def forward_passes(steps: int = DEFAULT_STEPS, random_orders: int = DEFAULT_RANDOM_ORDERS, protocol: Protocol = BLUR) -> int:
    """Images one map's faithfulness score (``faithfulness.deletion_insertion``) runs through the model
    (``Protocol.images`` of its curves)."""
    return protocol.images(protocol.runs_of(1, random_orders), steps)


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
