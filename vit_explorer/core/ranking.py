"""The scoreboard: every map method of one image ranked by its faithfulness, against chance and the randomised model
(``methods.scoreboard`` computes it)."""

from __future__ import annotations

from dataclasses import dataclass

from vit_explorer.core.curves import FALLEN, PROBABILITY, Protocol

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
