"""Every map method for one image and one target, ranked by how faithful it is, with chance and a sanity badge.

One run scores each method's map by the chosen protocol (blur or mean deletion/insertion, or ROAD's MoRF/LeRF:
``faithfulness``) and ranks them by one number, higher is better: insertion AUC − deletion AUC (ROAD: its combined
score, half that). Chance is the same number for random patch orders, drawn once and shared by every method, whose
spread says how far from chance a method must be to count. Each method also gets the Spearman ρ of its map with the
same map from the fully randomised model (``sanity``, its end point only): above ``curves.FALLEN`` the map barely depends on what
the
model learned. All perturbed images of all methods go through the model in shared batches.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from vit_explorer.core.analysis import Analysis, check_model, class_evidence
from vit_explorer.core.curves import BLUR, Protocol, area_under, fractions_of, reference_warning
from vit_explorer.core.maps import CLASS_METHODS, RolloutOptions, class_map
from vit_explorer.core.ranking import CHANCE_SPREAD_FLOOR, Entry, Scoreboard
from vit_explorer.errors import VitExplorerError
from vit_explorer.methods import faithfulness
from vit_explorer.methods.faithfulness import importance_order
from vit_explorer.methods.sanity import sanity_check
from vit_explorer.models.base import LoadedModel

# coarser than one map's score (``faithfulness.DEFAULT_STEPS``): the board scores every method at once, in seconds
STEPS = 8
RANDOM_ORDERS = 3


def batches(methods: int, steps: int = STEPS, random_orders: int = RANDOM_ORDERS, protocol: Protocol = BLUR,
            batch_size: int = faithfulness.BATCH_SIZE) -> int:
    """Batches one ``scoreboard`` runs (its progress bar's length, before the sanity check's layers)."""
    return math.ceil(protocol.images(protocol.runs_of(methods, random_orders), steps) / batch_size)


def scoreboard(model: LoadedModel, analysis: Analysis, target: int | str | None = None, *, methods: tuple[str, ...] | None = None,
               protocol: Protocol = BLUR, steps: int = STEPS, random_orders: int = RANDOM_ORDERS, seed: int = 0,
               options: RolloutOptions = RolloutOptions(), batch_size: int = faithfulness.BATCH_SIZE,
               step: Callable[[], None] | None = None) -> Scoreboard:
    """Rank ``methods`` (default: all of ``CLASS_METHODS``) for the image of ``analysis`` and ``target`` (default: the
    top class). ``step`` is called after each batch of perturbed images and after each layer the sanity check
    randomises (``batches`` + layers calls)."""
    check_model(model, analysis)
    measure = faithfulness.measure_of(model)
    methods = tuple(CLASS_METHODS) if methods is None else tuple(methods)
    unknown = [method for method in methods if method not in CLASS_METHODS]
    if unknown:
        raise VitExplorerError(f"unknown method {', '.join(unknown)}; use some of {', '.join(CLASS_METHODS)}")
    evidence = class_evidence(model, analysis, target, methods)
    maps = {method: class_map(analysis, method, evidence, options) for method in methods}
    randoms = faithfulness.random_patch_orders(model.layout, random_orders, seed)
    runs = [run for method in methods for run in protocol.map_runs(importance_order(maps[method]))]
    runs += protocol.random_runs(randoms)
    probs, _ = faithfulness.perturbed_probabilities(model, analysis.image, runs, evidence.target, steps, protocol, seed,
                                                    batch_size, step)
    fractions = fractions_of(steps)
    aucs = torch.tensor([area_under(fractions, curve) for curve in probs], dtype=torch.float64)  # [runs]
    chance = aucs[2 * len(methods) :]
    if protocol.imputes:
        # ROAD's random orders stand for both curves: chance's score pairs one order's LeRF with another's MoRF
        pairs = [(a, b) for a in range(random_orders) for b in range(random_orders) if a != b] or [(0, 0)]
        chance_scores = torch.tensor([protocol.combined(float(chance[a]), float(chance[b])) for a, b in pairs],
                                     dtype=torch.float64)
    else:  # each order's insertion − its deletion
        chance_scores = protocol.combined(chance[:random_orders], chance[random_orders:])
    chance_mean = float(chance_scores.mean())
    chance_sd = float(chance_scores.std(correction=1)) if len(chance_scores) > 1 else float("nan")
    sanity = sanity_check(model, analysis, evidence.target, methods=methods, options=options, seed=seed, cascade=False, step=step)
    spread = chance_sd if chance_sd >= CHANCE_SPREAD_FLOOR else float("nan")
    entries = []
    for index, method in enumerate(methods):
        deletion, insertion = float(aucs[2 * index]), float(aucs[2 * index + 1])
        score = protocol.combined(deletion, insertion)
        entries.append(Entry(method=method, deletion=deletion, insertion=insertion, score=score,
                             over_chance=(score - chance_mean) / spread, randomised_rho=float(sanity.final[method])))
    scores = [entry.score for entry in entries]
    unranked = reference_warning(measure, probs)
    if not unranked and max(scores) - min(scores) < CHANCE_SPREAD_FLOOR:
        unranked = (f"every method scores the same ({min(scores):.3f} to {max(scores):.3f}): the target barely moves when "
                    f"patches are removed, so there is nothing to rank")
    notes = () if chance_sd >= CHANCE_SPREAD_FLOOR else (
        f"chance's scores do not spread (sd {chance_sd:.1e}, below {CHANCE_SPREAD_FLOOR:g}): no distance from chance is given",)
    if unranked:  # nothing is compared: no distance from chance either
        entries = [dataclasses.replace(entry, over_chance=float("nan")) for entry in entries]
    else:
        entries.sort(key=lambda entry: -entry.score)
    return Scoreboard(target=evidence.target, target_label=analysis.label(evidence.target), protocol=protocol, steps=steps,
                      random_orders=random_orders, entries=tuple(entries), chance_mean=chance_mean, chance_sd=chance_sd,
                      measure=measure, unranked=unranked, notes=notes)

