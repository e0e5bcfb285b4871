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
from collections.abc import Callable, Mapping

import torch
from torch import nn

from vit_explorer.core import statistics
from vit_explorer.core.analysis import Analysis, ClassEvidence, check_model
from vit_explorer.core.capture import capture_lock
from vit_explorer.core.curves import SanityCurves
from vit_explorer.core.maps import CLASS_METHODS, CLASS_SPECIFIC, RolloutOptions, class_map
from vit_explorer.errors import VitExplorerError
from vit_explorer.methods.evaluation import Labelled, sample_analyses
from vit_explorer.models.base import LoadedModel

# a map computed from one analysis (and the target's evidence, None for a backbone) ``[grid_h, grid_w]``
MapFunction = Callable[[Analysis, ClassEvidence | None], torch.Tensor]


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


def sanity_check(model: LoadedModel, analysis: Analysis, target: int | str | None = None, *,
                 methods: tuple[str, ...] | None = None,
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
        _, randomised, evidence = next(sample_analyses(copied, [sample], methods=methods))
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
