"""Does a map depend on what the model learned? Cascading parameter randomisation (Adebayo et al. 2018,
"Sanity Checks for Saliency Maps").

The layers of a copy of the model are re-drawn at random from the top down, one more at a time. After
each step every map method is recomputed for the same image and the same target class (the trained
model's) and compared with the trained model's map by Spearman rank correlation over the patches. A
map that explains the model falls towards 0 as its layers lose what they learned; one that stays near
1 shows the image, or the method's own prior, rather than the model.

Re-drawing rule: every parameter tensor of a layer (a layer is what the adapter's ``blocks`` gives) is
replaced by independent normal values with that tensor's own mean and standard deviation, so that
scales (norms, layer scale, biases) keep their size while the learned structure goes; a tensor without
spread (one value, or all equal) keeps its value. One CPU generator, seeded once, draws the layers in order, so a seed gives the
same randomised model on any device. The embeddings and the classifier head stay trained. Only a deep
copy is randomised: the caller's model (the app caches it) is never touched.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from vit_explorer.core import statistics
from vit_explorer.core.analysis import Analysis, ClassEvidence, check_model
from vit_explorer.core.capture import capture_lock
from vit_explorer.core.maps import CLASS_METHODS, CLASS_SPECIFIC, RolloutOptions, class_map
from vit_explorer.errors import VitExplorerError
from vit_explorer.methods.evaluation import Labelled, sample_analyses
from vit_explorer.models.base import LoadedModel

FALLEN = 0.5  # a rank correlation below this no longer resembles the trained model's map

# a map computed from one analysis (and the target's evidence, None for a backbone) ``[grid_h, grid_w]``
MapFunction = Callable[[Analysis, ClassEvidence | None], torch.Tensor]


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
            steps = [step for step, value in zip(self.randomised_layers, values) if value < below]
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
        parts = [f"{method} {'never' if fallen is None else f'{fallen} of {layers}'} (ρ {self.final[method]:.2f} with all {layers})"
                 for method, fallen in self.layers_to_fall().items()]
        return (f"sanity check: layers randomised from the top until the map's Spearman ρ with the trained model's fell below "
                f"{FALLEN}: {'; '.join(parts)}. Few layers: the map depends on what the model learned; most or all, or never: "
                f"it mostly shows the input and the lowest layers")


def randomise(block: nn.Module, generator: torch.Generator) -> None:
    """Re-draw every parameter of ``block`` in place, from a normal with the tensor's own mean and
    standard deviation (module doc)."""
    with torch.no_grad():
        for parameter in block.parameters():
            original = parameter.detach().float()
            std = original.std(unbiased=False)  # population spread: 0, not NaN, for one value
            drawn = torch.randn(parameter.shape, generator=generator) * std.cpu() + original.mean().cpu()
            parameter.copy_(drawn.to(parameter.device, parameter.dtype))


def default_methods(analysis: Analysis) -> tuple[str, ...]:
    """Every method of ``maps.CLASS_METHODS`` the model allows: the class-specific ones need a classifier head."""
    return tuple(method for method in CLASS_METHODS if analysis.num_classes or method not in CLASS_SPECIFIC)


def sanity_check(model: LoadedModel, analysis: Analysis, target: int | str | None = None, *, methods: tuple[str, ...] | None = None,
                 extra: Mapping[str, MapFunction] | None = None, options: RolloutOptions = RolloutOptions(),
                 seed: int = 0, cascade: bool = True, step: Callable[[], None] | None = None) -> SanityCurves:
    """Cascading randomisation of ``model``'s layers for the image of ``analysis``.

    Args:
        model: the model ``analysis`` was made with; it is copied, never changed.
        analysis: gives the image as the model saw it.
        target: the class the class-specific maps explain (index or name; default: the top prediction).
        methods: ``maps.CLASS_METHODS`` keys (default: ``default_methods``).
        extra: more maps by name, each a function of an analysis and the target's evidence.
        options: rollout options of the rollout-based maps.
        seed: seed of the random layers.
        cascade: False: only the end point, every layer randomised at once (the same draws, so the same
            correlation as the cascade's last step): ``randomised_layers`` is then ``[0, layers]``.
        step: called after each layer is randomised (and the maps recomputed, in a cascade): a progress bar's advance.

    Costs one forward and one backward pass per step (layers + 1 of them, or 2 without ``cascade``) and a copy of
    the model.
    """
    check_model(model, analysis)
    methods = default_methods(analysis) if methods is None else tuple(methods)
    unknown = [method for method in methods if method not in CLASS_METHODS]
    if unknown:
        raise VitExplorerError(f"unknown map method {', '.join(map(repr, unknown))}; use some of {', '.join(CLASS_METHODS)}")
    if analysis.num_classes == 0 and any(method in CLASS_SPECIFIC for method in methods):
        raise VitExplorerError(f"{', '.join(m for m in methods if m in CLASS_SPECIFIC)} explain a class score, "
                               f"and {model.name} has no classifier head; check rollout and cls instead")
    functions: dict[str, MapFunction] = {method: lambda a, e, m=method: class_map(a, m, e, options) for method in methods}
    functions.update(extra or {})
    # a backbone has no class to explain, and a target given for one is refused by class_index
    index = analysis.class_index(target) if analysis.num_classes or target is not None else None
    # a capture on the original holds its lock while its hooks are attached, so the copy never inherits them
    with capture_lock(model.module):
        copied = dataclasses.replace(model, module=copy.deepcopy(model.module))
    sample = Labelled(image=analysis.image, label=-1 if index is None else index)

    def current_maps() -> dict[str, torch.Tensor]:
        _, randomised, evidence = next(sample_analyses(copied, [sample]))
        return {name: function(randomised, evidence) for name, function in functions.items()}

    trained = current_maps()
    # the trained model against itself: 1, or NaN for a constant map, which has no ranking to keep
    correlations = {name: [statistics.spearman(trained[name], trained[name])] for name in functions}
    blocks = copied.adapter.blocks(copied.module)
    generator = torch.Generator().manual_seed(seed)
    for depth, block in enumerate(reversed(blocks), start=1):
        randomise(block, generator)
        if cascade or depth == len(blocks):
            for name, grid_map in current_maps().items():
                correlations[name].append(statistics.spearman(trained[name], grid_map))
        if step is not None:
            step()
    steps = list(range(len(blocks) + 1)) if cascade else [0, len(blocks)]
    return SanityCurves(methods=tuple(functions), randomised_layers=steps, correlations=correlations,
                        target=index, target_label=None if index is None else analysis.label(index), model_name=model.name,
                        seed=seed)
