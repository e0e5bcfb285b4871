"""What calibration chose for a test-time register (``methods.registers``), as ``registers.json`` holds it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from vit_explorer.core.token_norms import RULE
from vit_explorer.errors import VitExplorerError

REGISTER = "tt-reg"  # the test-time register's name among the prefix tokens


@dataclass(frozen=True)
class RegisterNeurons:
    """What calibration chose for one model, as ``registers.json`` holds it.

    Attributes:
        model: the model's spec; the file applies to it only.
        neurons: the chosen ``(layer, neuron, score)``, best first; score: the neuron's mean absolute activation at the
            outlier tokens, averaged over the images that had any. Empty: the file changes nothing.
        top_k, highest_layer, detect_layer: the calibration's settings (``calibrate``).
        images: images read; images_with_outliers: those with at least one outlier token; outlier_tokens: all of them.
        rule: how outlier tokens were found; settings: where the settings came from (the authors' for a family).
    """

    model: str
    neurons: tuple[tuple[int, int, float], ...]
    top_k: int
    highest_layer: int
    detect_layer: int
    images: int
    images_with_outliers: int
    outlier_tokens: int
    rule: str = RULE
    settings: str = ""

    @property
    def changes_nothing(self) -> bool:
        return not self.neurons

    def by_layer(self) -> dict[int, list[int]]:
        """The chosen neurons grouped by layer, in the order chosen."""
        layers: dict[int, list[int]] = {}
        for layer, neuron, _ in self.neurons:
            layers.setdefault(layer, []).append(neuron)
        return layers

    def summary(self) -> str:
        """One line: what was found and chosen."""
        if self.changes_nothing:
            return (f"no outlier tokens in {self.images} images at layer {self.detect_layer} ({self.rule}): no register "
                    "neurons chosen, and a test-time register changes nothing")
        layers = sorted(self.by_layer())
        return (f"{self.outlier_tokens} outlier tokens in {self.images_with_outliers} of {self.images} images at layer "
                f"{self.detect_layer}; {len(self.neurons)} register neurons chosen in layer(s) {', '.join(map(str, layers))}")

    def to_json(self) -> str:
        record = asdict(self)
        record["neurons"] = [{"layer": layer, "neuron": neuron, "score": score} for layer, neuron, score in self.neurons]
        record["summary"] = self.summary()
        return json.dumps(record, indent=2) + "\n"

    @classmethod
    def read(cls, path: str | Path) -> RegisterNeurons:
        """A file written by ``vit-explorer registers``."""
        try:
            record = json.loads(Path(path).read_text())
            neurons = tuple((int(entry["layer"]), int(entry["neuron"]), float(entry["score"])) for entry in record["neurons"])
            return cls(model=record["model"], neurons=neurons, top_k=int(record["top_k"]),
                       highest_layer=int(record["highest_layer"]), detect_layer=int(record["detect_layer"]),
                       images=int(record["images"]), images_with_outliers=int(record["images_with_outliers"]),
                       outlier_tokens=int(record["outlier_tokens"]), rule=record.get("rule", RULE),
                       settings=record.get("settings", ""))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise VitExplorerError(f"{path}: not a registers file written by `vit-explorer registers` ({error})") from None


