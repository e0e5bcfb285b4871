"""``explain``: from an image to one map, in one call, for notebooks and scripts; the result shows itself in Jupyter."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from vit_explorer.core.analysis import Analysis
from vit_explorer.core.decomposition import Decomposition
from vit_explorer.core.head_atlas import Atlas
from vit_explorer.core.images import ImageSource
from vit_explorer.core.maps import RolloutOptions
from vit_explorer.core.register_neurons import RegisterNeurons
from vit_explorer.core.request import Request
from vit_explorer.core.targets import OtherImage, Target
from vit_explorer.draw import report
from vit_explorer.models import DEFAULT_MODEL, LoadedModel, load_model
from vit_explorer.run import atlas as run_atlas
from vit_explorer.run import registered, run


@dataclass(frozen=True)
class Explanation:
    """One map of one image.

    Attributes:
        map: the map over the patch grid ``[grid_h, grid_w]`` (prefix tokens removed), a CPU tensor.
        method: its method (``CLASS_METHODS`` key).
        target: the label of what it explains: a class, or for a backbone its score ("similarity to the image's own
            embedding", "patch (row r, col c): its own output token"); None for a class-agnostic map (rollout, cls) asked for no
            target.
        probability: the target class's probability; None where there is no class.
        analysis: the analysis it was read from (every layer's maps, logits, layout).
        strength: the share of its target's score the map carries (``maps.map_strength``; below ``maps.NEGLIGIBLE`` its
            pattern is noise, and its display says so); None for a class-agnostic map.
        conserved: for AttnLRP, its relevance summed over the patches over the score (``maps.conservation``); else None.
    """

    map: torch.Tensor
    method: str
    target: str | None
    probability: float | None
    analysis: Analysis
    strength: float | None = None
    conserved: float | None = None

    def __repr__(self) -> str:
        # one line: the map's shape and range, not its values (the dataclass default printed ~20 KB of tensors)
        low, high = float(self.map.min()), float(self.map.max())
        probability = "" if self.probability is None else f", probability={self.probability:.3f}"
        return (f"Explanation(method={self.method!r}, target={self.target!r}{probability}, "
                f"map=[{self.map.shape[0]}×{self.map.shape[1]}] in [{low:.3g}, {high:.3g}], model={self.analysis.model_name!r})")

    def _repr_html_(self) -> str:
        return report.explanation_html(self.analysis, self.map, self.method, self.target, self.probability,
                                       strength=self.strength,
                                       conserved=self.conserved)

    def save_html(self, path: str | Path) -> Path:
        """The same display as a self-contained HTML file (pictures embedded, nothing fetched)."""
        path = Path(path)
        path.write_text(report.page(f"vit_explorer: {self.analysis.model_name}", self._repr_html_()), encoding="utf-8")
        return path


def loaded_inputs(image: ImageSource | np.ndarray, model: str | LoadedModel | None) -> tuple[LoadedModel, ImageSource]:
    """The model (loaded from its spec, or the built-in one) and the image, an array made a PIL image."""
    loaded = model if isinstance(model, LoadedModel) else load_model(model or DEFAULT_MODEL)
    return loaded, Image.fromarray(image) if isinstance(image, np.ndarray) else image


def explain(image: ImageSource | np.ndarray, model: str | LoadedModel | None = None, method: str = "relevance",
            target: int | str | tuple[int, int] | OtherImage | list[str] | None = None,
            options: RolloutOptions | None = None, registers: str | Path | RegisterNeurons | None = None) -> Explanation:
    """Explain ``image`` (a path, bytes, a PIL image or an ``[H, W, 3]`` uint8 array) with ``model`` (a spec such as
    ``"timm:vit_base_patch16_224"``, a loaded model, or None for the built-in one) by ``method`` (``CLASS_METHODS``),
    for ``target`` (a class name or index; None: the top class). ``registers`` (a file of ``vit-explorer registers``, or
    its neurons) adds a test-time register to the model first (``methods.registers``: the model is edited).

    A backbone has no class: its class-specific maps explain a projection (``core.targets``): of the image's embedding on
    its own direction (``target`` None), of the output token of the patch at ``target`` = (row, column) on its own
    direction (what that patch's representation is made of), or of the embedding on a second image's, ``target`` =
    ``OtherImage(source, name)`` (why the two match). Its class-agnostic maps (``rollout``, ``cls``) need none.

    A CLIP or SigLIP model explains a text: ``target="a photo of a dog"``, or several prompts, ``target=["a dog", "a
    cat"]`` (the best match explained; ``analysis.top_k()`` is the zero-shot prediction over them); the score is the model's
    own image–text logit.

    A Swin is read one stage at a time (``"timm:swin_tiny_patch4_window7_224#stage=2"``; stage 0 without the mark): the
    map is on that stage's grid, and every method chains all of its stages (``core.stage_maps``).
    """
    loaded, image = loaded_inputs(image, model)
    if registers is not None:
        loaded = registered(loaded, registers)
    request = Request(method=method, target=Target.of(target, loaded), options=options or RolloutOptions())
    result = run(loaded, image, request)
    analysis, evidence, shown = result.analysis, result.evidence, result.maps[method]
    # a class-agnostic map explains no class: it names none, unless one was asked for
    named = evidence is not None and request.explains
    probability = float(analysis.probs[evidence.target]) if named and not analysis.similarity else None
    return Explanation(map=shown.map, method=method, target=result.target_label if named else None, probability=probability,
                       analysis=analysis, strength=shown.strength, conserved=shown.conserved)


def decompose(image: ImageSource | np.ndarray, model: str | LoadedModel | None = None,
              target: int | str | tuple[int, int] | OtherImage | list[str] | None = None) -> Decomposition:
    """The score of ``target`` (as in ``explain``: a class, None for the top class; for a backbone its similarity
    score; a CLIP model's prompt) for ``image`` split exactly over what the model's parts write into the stream it is
    read from: each head of each layer (``.heads`` ``[layers, heads]``, and over the patches it attended to,
    ``.head_patches``), each MLP (``.mlps``), the embeddings and the biases (``.rest``), with the final norm's scale held
    at the image's own; and the logit lens (``.lens``: the score read after every layer). ``core.decomposition`` says
    what a direct contribution does and does not show."""
    loaded, image = loaded_inputs(image, model)
    return run(loaded, image, Request(target=Target.of(target, loaded), decompose=True)).decomposition


def atlas(folder: str | Path, model: str | LoadedModel | None = None, **options: Any) -> Atlas | None:
    """What each head of ``model`` (a spec, a loaded model, or None for the built-in one) does across the images of
    ``folder`` (a folder, one sub-folder per class giving labels; a text file of paths; a glob): its statistics, its
    direct share of each image's answer, its top images, and for a model that reads text its TextSpan descriptions with
    the completeness check. ``options``: ``run.atlas``'s (``prompts``, ``bank``, ``texts_per_head``, ``late_layers``,
    ``batch_size``, ``limit``, ``fit``). ``draw.files.write_atlas`` writes it as ``vit-explorer atlas`` does."""
    return run_atlas(model or DEFAULT_MODEL, folder, **options)
