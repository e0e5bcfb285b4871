"""Captions of generated images, and whether a caption is true of an image: what the shapes-CLIP learns to match.

Each image is described by its objects (``Thing``: the shape, where its centre lies, how large it is). A ``Caption`` is
a small structured claim rendered to words: that a shape is present ("a star"), present at a size ("a small star"),
on one side ("the star on the left"; with two objects, relative to the other one), that two shapes are present ("a
star and a circle"), or how many shapes there are ("two shapes"). Because a caption is a claim, its truth on any image
is computed, not assumed: the training loss knows that "a star" is also true of the other star images in a batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vit_explorer.shapes.generator import CLASSES, IMAGE_SIZE

SMALL, LARGE = 56, 88  # object diameters in pixels below and above which a caption calls it small or large
SIDE_MARGIN = 24  # pixels: a lone object is on a side when its centre is this far past the middle
NUMBERS = ("one", "two")
SIDES = {"left": (0, -1), "right": (0, 1), "top": (1, -1), "bottom": (1, 1)}  # (axis: 0 x, 1 y; direction)
# every word a caption uses, in a fixed order: the shipped text tower's vocabulary
VOCABULARY = ("[pad]", "[cls]", "[unk]", "a", "an", "the", "and", "on", "at", "of", "image", "photo", "shape", "shapes",
              "small", "large", *NUMBERS, *SIDES, *CLASSES)


@dataclass(frozen=True)
class Thing:
    """One object of an image: its class index, its centre (x, y) and its diameter in pixels."""

    label: int
    centre: tuple[float, float]
    diameter: float

    @classmethod
    def from_mask(cls, label: int, mask: np.ndarray) -> Thing:
        ys, xs = np.nonzero(mask)
        return cls(label, (float(xs.min() + xs.max() + 1) / 2, float(ys.min() + ys.max() + 1) / 2),
                   float(max(xs.max() - xs.min(), ys.max() - ys.min()) + 1))

    @property
    def size(self) -> str | None:
        return "small" if self.diameter < SMALL else "large" if self.diameter > LARGE else None


def side_of(thing: Thing, things: tuple[Thing, ...], side: str) -> bool:
    """Whether ``thing`` lies on ``side``: of the other object when there are two, of the image when alone."""
    axis, direction = SIDES[side]
    others = [other for other in things if other is not thing]
    reference = others[0].centre[axis] if others else IMAGE_SIZE / 2
    margin = 0 if others else SIDE_MARGIN
    return direction * (thing.centre[axis] - reference) > margin


@dataclass(frozen=True)
class Caption:
    """A claim about an image: ``kind`` one of has, sized, side, pair, count; ``shapes`` the class indices it names;
    ``word`` its size, side or number."""

    kind: str
    shapes: tuple[int, ...] = ()
    word: str | None = None

    @property
    def text(self) -> str:
        names = [CLASSES[shape] for shape in self.shapes]
        if self.kind == "has":
            return f"a {names[0]}"
        if self.kind == "sized":
            return f"a {self.word} {names[0]}"
        if self.kind == "side":
            return f"the {names[0]} {'on the' if self.word in ('left', 'right') else 'at the'} {self.word}"
        if self.kind == "pair":
            return f"a {names[0]} and a {names[1]}"
        return f"{self.word} {'shape' if self.word == 'one' else 'shapes'}"

    def true_of(self, things: tuple[Thing, ...]) -> bool:
        matching = [thing for thing in things if not self.shapes or thing.label == self.shapes[0]]
        if self.kind == "has":
            return bool(matching)
        if self.kind == "sized":
            return any(thing.size == self.word for thing in matching)
        if self.kind == "side":
            return any(side_of(thing, things, self.word) for thing in matching)
        if self.kind == "pair":
            labels = {thing.label for thing in things}
            return set(self.shapes) <= labels
        return len(things) == NUMBERS.index(self.word) + 1


def true_captions(things: tuple[Thing, ...]) -> list[Caption]:
    """Every caption this grammar can say that is true of an image of ``things``."""
    found = [Caption("count", word=NUMBERS[len(things) - 1])]
    for thing in things:
        found.append(Caption("has", (thing.label,)))
        if thing.size is not None:
            found.append(Caption("sized", (thing.label,), thing.size))
        found += [Caption("side", (thing.label,), side) for side in SIDES if side_of(thing, things, side)]
    if len(things) == 2:
        found += [Caption("pair", (things[0].label, things[1].label)), Caption("pair", (things[1].label, things[0].label))]
    return found


# how often each kind is drawn as an image's caption (the named shapes matter most, so "has" and "side" lead)
KIND_WEIGHTS = {"has": 0.35, "side": 0.25, "sized": 0.15, "pair": 0.2, "count": 0.05}


def draw_caption(things: tuple[Thing, ...], rng: np.random.Generator) -> Caption:
    """One true caption of an image of ``things``, its kind drawn by ``KIND_WEIGHTS`` among the kinds it has."""
    by_kind: dict[str, list[Caption]] = {}
    for caption in true_captions(things):
        by_kind.setdefault(caption.kind, []).append(caption)
    kinds = list(by_kind)
    weights = np.array([KIND_WEIGHTS[kind] for kind in kinds])
    kind = kinds[int(rng.choice(len(kinds), p=weights / weights.sum()))]
    return by_kind[kind][int(rng.integers(len(by_kind[kind])))]
