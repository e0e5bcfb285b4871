"""What is asked about one image (a ``Request``) and what answering it computed (a ``Run``): values, no model inside.

``vit_explorer.run`` turns a request into a run; the entry points (the CLI's ``analyze``, ``explain``, the app's export)
only build the request and show the run, and ``draw`` turns a run into pictures, charts and files without running
anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vit_explorer.core.analysis import DEFAULT_MEMORY_BUDGET, Analysis, ClassEvidence
from vit_explorer.core.curves import BLUR, DEFAULT_RANDOM_ORDERS, DEFAULT_STEPS, FaithfulnessCurves, Protocol, SanityCurves
from vit_explorer.core.decomposition import Decomposition
from vit_explorer.core.interventions import HeadAblation
from vit_explorer.core.maps import CLASS_METHODS, CLASS_SPECIFIC, ClassMap, Overview, RolloutOptions
from vit_explorer.core.ranking import Scoreboard
from vit_explorer.core.targets import Target
from vit_explorer.core.token_norms import TokenNorms
from vit_explorer.errors import VitExplorerError


@dataclass(frozen=True)
class Request:
    """What to compute for one image.

    Attributes:
        method: the map asked for (``maps.CLASS_METHODS``): written, scored and shown.
        target: what the class-specific methods explain (``targets.Target``).
        every_map: also every other method's map (a report shows them all).
        score: score ``method``'s map by ``protocol`` where the model gives a score (a classifier, or a backbone with a
            similarity target).
        protocol, steps, random_orders: how it is scored (``curves.Protocol``).
        scoreboard: rank every method by ``protocol`` (``methods.scoreboard``).
        sanity: the cascading randomisation check (``methods.sanity``).
        ablation: remove each head in this mode (``interventions.ABLATION_MODES``); None: no ablation.
        norms: token norms and their outliers (``methods.norms``; no extra pass).
        decompose: the target's score split over heads, MLPs, embeddings and biases, with the logit lens
            (``core.decomposition``).
        options: rollout options of the rollout-based maps.
        overview: the first views (``maps.overview``: rollout, last layer, every head), which files and reports show.
        full_maps: every head's full map must be kept, to be written: a model whose maps are above the memory budget is
            refused before any pass.
        memory_budget: bytes of maps kept (``analysis.analyze``); fit: how an image of other proportions meets the input.
    """

    method: str = "rollout"
    target: Target = field(default_factory=Target)
    every_map: bool = False
    score: bool = False
    protocol: Protocol = BLUR
    steps: int = DEFAULT_STEPS
    random_orders: int = DEFAULT_RANDOM_ORDERS
    scoreboard: bool = False
    sanity: bool = False
    ablation: str | None = None
    norms: bool = False
    decompose: bool = False
    options: RolloutOptions = field(default_factory=RolloutOptions)
    overview: bool = False
    full_maps: bool = False
    memory_budget: int = DEFAULT_MEMORY_BUDGET
    fit: str = "stretch"

    def __post_init__(self) -> None:
        if self.method not in CLASS_METHODS:
            raise VitExplorerError(f"unknown method {self.method!r}; use one of {', '.join(CLASS_METHODS)}")

    @property
    def explains(self) -> bool:
        """Whether anything asked for needs a target: a class-specific map, a target named, the scoreboard, the sanity
        check or the ablation (a backbone then gets its similarity target, ``targets``)."""
        return (self.method in CLASS_SPECIFIC or self.target.value is not None or self.scoreboard or self.sanity
                or self.ablation is not None or self.decompose)

    @property
    def maps(self) -> tuple[str, ...]:
        """The methods whose maps the run keeps: ``method``, and with ``every_map`` all of them."""
        return tuple(CLASS_METHODS) if self.every_map else (self.method,)


@dataclass(frozen=True)
class Run:
    """Everything one ``Request`` computed for one image, as values: the analysis (of the similarity model where a
    backbone got a similarity target), its target's evidence, each map asked for (``maps.ClassMap``), the overview where
    asked, and every result that ran (None where it did not). Nothing here holds or runs the model."""

    request: Request
    analysis: Analysis
    evidence: ClassEvidence | None
    maps: dict[str, ClassMap]
    curves: FaithfulnessCurves | None = None
    scoreboard: Scoreboard | None = None
    sanity: SanityCurves | None = None
    ablation: HeadAblation | None = None
    ablation_importance: torch.Tensor | None = None  # [layers, heads]: Σ|∇A ⊙ A| of the ablation's target
    norms: TokenNorms | None = None
    decomposition: Decomposition | None = None
    overview: Overview | None = None

    @property
    def target_label(self) -> str | None:
        """What the class-specific maps explain, in words; None where nothing has a target."""
        return None if self.evidence is None else self.analysis.label(self.evidence.target)
