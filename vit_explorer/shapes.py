"""A synthetic data set that knows the answer: one shape per cluttered image, with its pixel mask.

Deterministic from a seed, no downloads. The embedded default model is trained on it, and the
masks are the ground truth for tests of capture and rollout (pointing game, energy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

CLASSES = ("circle", "square", "triangle", "star", "cross", "ring")
IMAGE_SIZE = 256
MIN_SIZE, MAX_SIZE = 32, 96  # object diameter in pixels: 2 to 6 patches of 16
OBJECT_NOISE = 6.0  # grey levels of noise on the object
# ±15° of rotation, on top of which training turns and flips each batch by quarter turns; any angle at
# all left a ViT learning from scratch on 2 CPU cores at chance for far longer than the training budget
MAX_ROTATION = math.radians(15)
# the object is brighter than the (darkened) background: random hues, but one contrast polarity, which a
# ViT trained from scratch on 2 CPU cores picks up far sooner than edges of either polarity
BACKGROUND_LEVEL = 0.55
OBJECT_LOW = 150.0


@dataclass(frozen=True)
class Sample:
    """One generated image: ``image`` ``[H, W, 3]`` uint8, ``mask`` ``[H, W]`` bool, bbox (x0, y0, x1, y1)."""

    image: np.ndarray
    label: int
    mask: np.ndarray
    bbox: tuple[int, int, int, int]

    @property
    def class_name(self) -> str:
        return CLASSES[self.label]


def _polygon(kind: str, cx: float, cy: float, radius: float, angle: float) -> list[tuple[float, float]]:
    if kind == "square":
        corners = [(1, 1), (-1, 1), (-1, -1), (1, -1)]
        points = [(x * radius * 0.75, y * radius * 0.75) for x, y in corners]
    elif kind == "triangle":
        points = [(radius * math.cos(a), radius * math.sin(a)) for a in np.linspace(0, 2 * math.pi, 4)[:3] - math.pi / 2]
    elif kind == "star":
        points = [
            ((radius if i % 2 == 0 else radius * 0.42) * math.cos(a), (radius if i % 2 == 0 else radius * 0.42) * math.sin(a))
            for i, a in enumerate(np.linspace(0, 2 * math.pi, 11)[:10] - math.pi / 2)
        ]
    elif kind == "cross":
        arm = radius * 0.33
        points = [(arm, radius), (-arm, radius), (-arm, arm), (-radius, arm), (-radius, -arm), (-arm, -arm),
                  (-arm, -radius), (arm, -radius), (arm, -arm), (radius, -arm), (radius, arm), (arm, arm)]
    else:
        raise ValueError(kind)
    cos, sin = math.cos(angle), math.sin(angle)
    return [(cx + x * cos - y * sin, cy + x * sin + y * cos) for x, y in points]


def draw_shape(draw: ImageDraw.ImageDraw, kind: str, cx: float, cy: float, radius: float, angle: float) -> None:
    box = (cx - radius, cy - radius, cx + radius, cy + radius)
    if kind == "circle":
        draw.ellipse(box, fill=255)
    elif kind == "ring":
        draw.ellipse(box, fill=255)
        inner = radius * 0.55
        draw.ellipse((cx - inner, cy - inner, cx + inner, cy + inner), fill=0)
    else:
        draw.polygon(_polygon(kind, cx, cy, radius, angle), fill=255)


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """Gradient + low-frequency texture + pixel noise ``[size, size, 3]`` float in [0, 255]."""
    start, end = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    direction = rng.uniform(0, 2 * math.pi)
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32) / size
    t = np.cos(direction) * xs + np.sin(direction) * ys
    t = (t - t.min()) / (t.max() - t.min())
    image = start.astype(np.float32) + (end - start).astype(np.float32) * t[..., None]
    coarse = rng.normal(0, 1, (8, 8, 3))
    texture = np.asarray(Image.fromarray(((coarse + 3) * 40).clip(0, 255).astype(np.uint8)).resize((size, size), Image.Resampling.BICUBIC), dtype=np.float32)
    image += (texture - texture.mean()) * np.float32(rng.uniform(0.2, 0.6))
    image += rng.standard_normal(image.shape, dtype=np.float32) * np.float32(rng.uniform(3, 12))
    return image


def _distractors(rng: np.random.Generator, canvas: Image.Image) -> None:
    """Thin strokes and arcs that are clearly not one of the shapes."""
    draw = ImageDraw.Draw(canvas)
    size = canvas.size[0]
    for _ in range(rng.integers(3, 9)):
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        width = int(rng.integers(1, 4))
        if rng.random() < 0.5:
            points = [tuple(float(v) for v in rng.uniform(0, size, 2)) for _ in range(rng.integers(2, 5))]
            draw.line(points, fill=colour, width=width)
        else:
            x, y = rng.uniform(0, size, 2)
            r = rng.uniform(10, 40)
            start = rng.uniform(0, 360)
            draw.arc((x - r, y - r, x + r, y + r), start, start + rng.uniform(40, 160), fill=colour, width=width)


def generate(rng: np.random.Generator, size: int = IMAGE_SIZE) -> Sample:
    """One labelled image drawn with ``rng``."""
    label = int(rng.integers(len(CLASSES)))
    background = _background(rng, size) * BACKGROUND_LEVEL
    canvas = Image.fromarray(background.clip(0, 255).astype(np.uint8))
    _distractors(rng, canvas)
    radius = rng.uniform(MIN_SIZE, MAX_SIZE) / 2
    cx, cy = rng.uniform(radius + 2, size - radius - 2, 2)
    mask_image = Image.new("L", (size, size), 0)
    draw_shape(ImageDraw.Draw(mask_image), CLASSES[label], cx, cy, radius, rng.uniform(-MAX_ROTATION, MAX_ROTATION))
    alpha = np.asarray(mask_image.filter(ImageFilter.GaussianBlur(0.6)), dtype=np.float32)[..., None] / 255.0
    pixels = np.asarray(canvas, dtype=np.float32)
    local = pixels[np.asarray(mask_image) > 0].mean(axis=0)
    # pick the object's colour far from what lies under it, so the shape is always visible
    candidates = rng.uniform(OBJECT_LOW, 255, (8, 3))
    colour = candidates[np.argmax(np.linalg.norm(candidates - local, axis=1))]
    shaded = colour.astype(np.float32) + rng.standard_normal(pixels.shape, dtype=np.float32) * OBJECT_NOISE
    image = (pixels * (1 - alpha) + shaded * alpha).clip(0, 255).astype(np.uint8)
    mask = np.asarray(mask_image) > 127
    ys, xs = np.nonzero(mask)
    return Sample(image=image, label=label, mask=mask, bbox=(int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1))


def generate_set(seed: int, count: int, size: int = IMAGE_SIZE) -> list[Sample]:
    """``count`` samples, the same for the same seed."""
    rng = np.random.default_rng(seed)
    return [generate(rng, size) for _ in range(count)]


EXAMPLES_SEED = 2026  # neither the training seed nor the held-out one


def write_examples(folder: Path, seed: int = EXAMPLES_SEED) -> list[Path]:
    """One generated image of each class as ``NN-class.png`` in ``folder`` (the app's examples)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    written: dict[int, Path] = {}
    while len(written) < len(CLASSES):
        sample = generate(rng)
        if sample.label not in written:
            path = folder / f"{len(written):02d}-{sample.class_name}.png"
            Image.fromarray(sample.image).save(path)
            written[sample.label] = path
    return sorted(written.values())
