"""An evaluation set of the six shapes drawn by code that shares nothing with ``vit_explorer.shapes``.

Used only to evaluate the shipped model, never to train or tune it. It differs from the training
generator in every part a shortcut could use:
- drawing: ``skimage.draw`` rasterises each shape at twice the size, and area-averaging down gives the
  anti-aliasing (the generator draws with PIL and blurs its masks); outlines come from
  ``scipy.ndimage`` erosion (the generator uses PIL rank filters);
- geometry: each class is rebuilt from its definition, with its own proportions (a star's inner
  radius, a cross's arm width, a ring's hole) drawn from ranges of its own;
- colour: hue, saturation and value in HSV, the object's value at least 0.25 from the background's,
  either way round (the generator picks RGB colours by distance);
- backgrounds of kinds the generator never makes: radial gradients, cross-hatching, salt-and-pepper
  speckle, Voronoi cells and multi-octave value noise;
- no JPEG, no blur, no colour jitter.
The mask is each shape's silhouette (a ring's hole excluded), as in the generator.
"""

from __future__ import annotations

import colorsys
import math
from dataclasses import dataclass

import numpy as np
from scipy import ndimage
from skimage import draw

CLASSES = ("circle", "square", "triangle", "star", "cross", "ring")  # the shipped model's labels, in its order
SIZE = 256
BACKGROUNDS = ("radial", "hatch", "speckle", "voronoi", "octaves")
INDEPENDENT_SEED = 31_337


@dataclass(frozen=True)
class Drawn:
    image: np.ndarray  # [SIZE, SIZE, 3] uint8
    label: int
    mask: np.ndarray  # [SIZE, SIZE] bool
    style: str
    background: str


def _hsv(h: float, s: float, v: float) -> np.ndarray:
    return np.array(colorsys.hsv_to_rgb(h % 1.0, s, v), dtype=np.float64) * 255


def _vertices(kind: str, rng: np.random.Generator, radius: float) -> np.ndarray:
    """Outline vertices ``[k, 2]`` (x, y) around the origin, before rotation."""
    if kind == "square":
        angles = np.arange(4) * math.pi / 2 + math.pi / 4
        return radius * np.stack([np.cos(angles), np.sin(angles)], 1)
    if kind == "triangle":
        angles = np.arange(3) * 2 * math.pi / 3
        return radius * np.stack([np.cos(angles), np.sin(angles)], 1)
    if kind == "star":
        inner = rng.uniform(0.38, 0.5)
        angles = np.arange(10) * math.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, radius, radius * inner)
        return np.stack([radii * np.cos(angles), radii * np.sin(angles)], 1)
    if kind == "cross":
        half = radius * rng.uniform(0.25, 0.4)
        r = radius
        return np.array([(half, r), (-half, r), (-half, half), (-r, half), (-r, -half), (-half, -half),
                         (-half, -r), (half, -r), (half, -half), (r, -half), (r, half), (half, half)], dtype=np.float64)
    raise ValueError(kind)


def _silhouette(kind: str, rng: np.random.Generator, centre: np.ndarray, radius: float, scale: int) -> np.ndarray:
    """The shape rasterised at ``scale`` times the image size, ``[SIZE·scale, SIZE·scale]`` bool."""
    side = SIZE * scale
    canvas = np.zeros((side, side), dtype=bool)
    cx, cy = centre * scale
    r = radius * scale
    if kind in ("circle", "ring"):
        canvas[draw.disk((cy, cx), r, shape=canvas.shape)] = True
        if kind == "ring":
            canvas[draw.disk((cy, cx), r * rng.uniform(0.45, 0.65), shape=canvas.shape)] = False
        return canvas
    theta = rng.uniform(0, 2 * math.pi)
    rotation = np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    points = _vertices(kind, rng, r) @ rotation.T + (cx, cy)
    canvas[draw.polygon(points[:, 1], points[:, 0], shape=canvas.shape)] = True
    return canvas


def _background(kind: str, rng: np.random.Generator, base_hsv: tuple[float, float, float]) -> np.ndarray:
    h, s, v = base_hsv
    first, second = _hsv(h, s, v), _hsv(h + rng.uniform(-0.15, 0.15), s * rng.uniform(0.5, 1),
                                        np.clip(v + rng.uniform(-0.15, 0.15), 0, 1))
    ys, xs = np.mgrid[0:SIZE, 0:SIZE] / SIZE
    if kind == "radial":
        cx, cy = rng.uniform(-0.2, 1.2, 2)
        t = np.clip(np.hypot(xs - cx, ys - cy) / rng.uniform(0.6, 1.4), 0, 1)
    elif kind == "hatch":
        period = rng.uniform(0.03, 0.08)
        t = np.zeros_like(xs)
        for angle in rng.uniform(0, math.pi, 2):
            phase = (np.cos(angle) * xs + np.sin(angle) * ys) / period % 1.0
            t = np.maximum(t, (phase < 0.18).astype(float))
    elif kind == "speckle":
        t = (rng.random((SIZE, SIZE)) < rng.uniform(0.05, 0.25)).astype(float)
    elif kind == "voronoi":
        seeds = rng.uniform(0, 1, (int(rng.integers(8, 30)), 2))
        nearest = np.argmin((xs[..., None] - seeds[:, 0]) ** 2 + (ys[..., None] - seeds[:, 1]) ** 2, axis=-1)
        t = rng.uniform(0, 1, len(seeds))[nearest]
    else:  # octaves of value noise, coarse to fine
        t = np.zeros_like(xs)
        for octave in range(4):
            cells = 4 * 2**octave
            values = rng.random((cells + 1, cells + 1))
            t += ndimage.zoom(values, SIZE / (cells + 1), order=1)[:SIZE, :SIZE] / 2**octave
        t = (t - t.min()) / (t.max() - t.min())
    return first + (second - first) * t[..., None]


def _scene(rng: np.random.Generator) -> tuple[np.ndarray, float, str]:
    """A background with a few thin anti-aliased lines ``[SIZE, SIZE, 3]`` float, its value and its kind."""
    background_kind = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))]
    background_value = rng.uniform(0.1, 0.9)
    image = _background(background_kind, rng, (rng.random(), rng.uniform(0, 0.9), background_value))
    for _ in range(int(rng.integers(0, 3))):  # a few thin anti-aliased lines
        r0, c0, r1, c1 = rng.integers(0, SIZE, 4)
        rows, cols, weight = draw.line_aa(r0, c0, r1, c1)
        image[rows, cols] = image[rows, cols] * (1 - weight[:, None]) + _hsv(rng.random(), 1, rng.random()) * weight[:, None]
    return image, background_value, background_kind


def _put(image: np.ndarray, rng: np.random.Generator, kind: str, centre: np.ndarray, radius: float, background_value: float
         ) -> tuple[np.ndarray, np.ndarray, str]:
    """``image`` with one ``kind`` shape painted at ``centre``, the shape's mask ``[SIZE, SIZE]`` and its style."""
    scale = 2
    silhouette = _silhouette(kind, rng, centre, radius, scale)
    style = "filled" if kind in ("circle", "ring") or rng.random() < 0.6 else "outlined"
    painted = silhouette
    if style == "outlined":
        stroke = int(rng.integers(3, max(4, int(radius * 0.3)))) * scale
        painted = silhouette & ~ndimage.binary_erosion(silhouette, iterations=stroke)
    # the object's value sits at least 0.25 from the background's, brighter or darker at random
    darker = background_value > 0.35 and (background_value > 0.65 or rng.random() < 0.5)
    value = rng.uniform(0.0, background_value - 0.25) if darker else rng.uniform(background_value + 0.25, 1.0)
    colour = _hsv(rng.random(), rng.uniform(0.2, 1.0), value)
    coverage = painted.reshape(SIZE, scale, SIZE, scale).mean(axis=(1, 3))[..., None]
    image = image * (1 - coverage) + colour * coverage
    return image, silhouette.reshape(SIZE, scale, SIZE, scale).mean(axis=(1, 3)) >= 0.5, style


def draw_independent(rng: np.random.Generator) -> Drawn:
    """One image of one shape, drawn from ``rng``."""
    label = int(rng.integers(len(CLASSES)))
    image, background_value, background_kind = _scene(rng)
    radius = rng.uniform(16, 56)
    centre = rng.uniform(radius + 3, SIZE - radius - 3, 2)
    image, mask, style = _put(image, rng, CLASSES[label], centre, radius, background_value)
    image += rng.normal(0, rng.uniform(0, 8), image.shape)
    return Drawn(np.clip(image, 0, 255).astype(np.uint8), label, mask, style, background_kind)


@dataclass(frozen=True)
class DrawnPair:
    image: np.ndarray  # [SIZE, SIZE, 3] uint8
    labels: tuple[int, int]  # two different classes
    masks: tuple[np.ndarray, np.ndarray]  # [SIZE, SIZE] bool each


def draw_independent_pair(rng: np.random.Generator) -> DrawnPair:
    """Two different shapes on one background, their centres far enough apart that the discs they fit in stay
    at least 36 pixels (two and a quarter patches of 16) from each other."""
    labels = tuple(int(label) for label in rng.choice(len(CLASSES), size=2, replace=False))
    image, background_value, _ = _scene(rng)
    radii = rng.uniform(16, 40, 2)
    while True:
        centres = [rng.uniform(radius + 3, SIZE - radius - 3, 2) for radius in radii]
        if np.linalg.norm(centres[0] - centres[1]) >= radii.sum() * 1.1 + 36:  # a star's points reach past its radius
            break
    masks = []
    for label, centre, radius in zip(labels, centres, radii, strict=True):
        image, mask, _ = _put(image, rng, CLASSES[label], centre, radius, background_value)
        masks.append(mask)
    image += rng.normal(0, rng.uniform(0, 8), image.shape)
    return DrawnPair(np.clip(image, 0, 255).astype(np.uint8), labels, (masks[0], masks[1]))


def independent_pairs(count: int, seed: int = INDEPENDENT_SEED + 1) -> list[DrawnPair]:
    """``count`` two-shape images, the same for the same seed."""
    rng = np.random.default_rng(seed)
    return [draw_independent_pair(rng) for _ in range(count)]


def independent_set(count: int, seed: int = INDEPENDENT_SEED) -> list[Drawn]:
    """``count`` images, the same for the same seed."""
    rng = np.random.default_rng(seed)
    return [draw_independent(rng) for _ in range(count)]
