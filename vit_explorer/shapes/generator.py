"""A synthetic data set that knows the answer: one shape per image, with its pixel mask.

Domain-randomised so that no shortcut stands in for the shape: the object may be darker or brighter
than what lies under it, at high or low contrast, at any rotation, filled, hollow, outlined or bordered,
1.5 to 8 patches across, on one of seven background families, among distractors that are none of the
six classes, then blurred, colour-jittered and JPEG-compressed. Deterministic from a seed, no
downloads. The embedded default model is trained on it; the masks are the ground truth of the
held-out checks (pointing game, energy). Figures on data this code did not draw come from the
independent set in ``tests/independent_shapes.py``.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from vit_explorer.errors import VitExplorerError

CLASSES = ("circle", "square", "triangle", "star", "cross", "ring")
IMAGE_SIZE = 256
PATCH = 16
MIN_SIZE, MAX_SIZE = 24, 128  # object diameter in pixels: 1.5 to 8 patches of 16
STYLES = ("filled", "hollow", "outline", "bordered")
# a hollow or outlined circle is a ring, and a bordered one is a ring round a disc, so circles are only ever filled
CIRCLE_STYLES = ("filled",)
RING_INNER = (0.4, 0.7)  # inner / outer radius of a ring; thinner would pass for an outlined circle
HOLLOW_INNER = (0.45, 0.75)  # inner / outer scale of a hollow polygon
BACKGROUNDS = ("flat", "gradient", "waves", "checker", "smooth", "blotches", "clutter")
MIN_CONTRAST = 45.0  # RGB distance of object and surround, before jitter: low, yet visible
# after jitter (a grey-scale one can erase a difference in hue) and compression, the mean RGB distance of the
# object's edge and the band around it; below it the object can be invisible, and the image is drawn again
MIN_VISIBLE = 20.0


@dataclass(frozen=True)
class Sample:
    """One generated image: ``image`` ``[H, W, 3]`` uint8, ``mask`` ``[H, W]`` bool (the shape's
    silhouette; a ring's hole is not part of it), bbox (x0, y0, x1, y1)."""

    image: np.ndarray
    label: int
    mask: np.ndarray
    bbox: tuple[int, int, int, int]

    @property
    def class_name(self) -> str:
        return CLASSES[self.label]


def _polygon(kind: str, cx: float, cy: float, radius: float, angle: float) -> list[tuple[float, float]]:
    if kind == "square":
        points = [(x * radius * 0.75, y * radius * 0.75) for x, y in ((1, 1), (-1, 1), (-1, -1), (1, -1))]
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


def draw_shape(draw: ImageDraw.ImageDraw, kind: str, cx: float, cy: float, radius: float, angle: float,
               fill: int = 255, inner: float = 0.55) -> None:
    """The silhouette of ``kind`` filled with ``fill`` (a ring's hole, ``inner`` of its radius, with 0)."""
    box = (cx - radius, cy - radius, cx + radius, cy + radius)
    if kind == "circle":
        draw.ellipse(box, fill=fill)
    elif kind == "ring":
        draw.ellipse(box, fill=fill)
        hole = radius * inner
        draw.ellipse((cx - hole, cy - hole, cx + hole, cy + hole), fill=0)
    else:
        draw.polygon(_polygon(kind, cx, cy, radius, angle), fill=fill)


def _layers(kind: str, style: str, window_hw: tuple[int, int], cx: float, cy: float, radius: float, angle: float,
            inner: float, stroke: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The object's silhouette, the part painted in its colour, and the part painted in the border colour,
    each ``window_hw`` uint8, drawn in a window around the object (centre given in the window's pixels)."""
    size = (window_hw[1], window_hw[0])
    silhouette = Image.new("L", size, 0)
    draw_shape(ImageDraw.Draw(silhouette), kind, cx, cy, radius, angle, inner=inner)
    painted = silhouette.copy()
    second = Image.new("L", size, 0)
    if style == "hollow":
        draw_shape(ImageDraw.Draw(painted), kind, cx, cy, radius * inner, angle, fill=0)
    elif style in ("outline", "bordered"):
        # the stroke is what an erosion by ``stroke`` pixels removes from the silhouette
        eroded = silhouette
        for _ in range(stroke):
            eroded = eroded.filter(ImageFilter.MinFilter(3))
        edge = Image.fromarray(np.where(np.asarray(silhouette) > np.asarray(eroded), 255, 0).astype(np.uint8))
        if style == "outline":
            painted = edge
        else:
            second = edge
    return np.asarray(silhouette), np.asarray(painted), np.asarray(second)


def _two_colours(rng: np.random.Generator, low_contrast: bool = False) -> tuple[np.ndarray, np.ndarray]:
    first = rng.uniform(0, 255, 3)
    second = first + rng.normal(0, 30 if low_contrast else 80, 3)
    return first.astype(np.float32), second.clip(0, 255).astype(np.float32)


def _background(rng: np.random.Generator, size: int, kind: str) -> np.ndarray:
    """One background of family ``kind``, ``[size, size, 3]`` float in [0, 255]."""
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32) / size
    first, second = _two_colours(rng, low_contrast=kind in ("waves", "checker") and rng.random() < 0.6)
    if kind == "flat":
        image = np.broadcast_to(first, (size, size, 3)).copy()
    elif kind == "gradient":
        direction = rng.uniform(0, 2 * math.pi)
        t = np.cos(direction) * xs + np.sin(direction) * ys
        t = (t - t.min()) / (t.max() - t.min())
        image = first + (second - first) * t[..., None]
    elif kind == "waves":
        t = np.zeros_like(xs)
        for _ in range(rng.integers(1, 4)):
            direction, frequency = rng.uniform(0, 2 * math.pi), rng.uniform(2, 14)
            t += np.sin(2 * math.pi * frequency * (np.cos(direction) * xs + np.sin(direction) * ys) + rng.uniform(0, 2 * math.pi))
        t = np.tanh(t * rng.uniform(0.5, 4)) * 0.5 + 0.5  # from soft waves to hard stripes
        image = first + (second - first) * t[..., None]
    elif kind == "checker":
        cell, direction = rng.uniform(6, 40) / size, rng.uniform(0, math.pi / 2)
        u, v = np.cos(direction) * xs + np.sin(direction) * ys, -np.sin(direction) * xs + np.cos(direction) * ys
        t = ((np.floor(u / cell) + np.floor(v / cell)) % 2).astype(np.float32)
        image = first + (second - first) * t[..., None]
    elif kind == "smooth":
        cells = int(rng.integers(3, 12))
        coarse = rng.normal(0, 1, (cells, cells, 3))
        texture = np.asarray(Image.fromarray(((coarse + 3) * 40).clip(0, 255).astype(np.uint8)).resize((size, size),
                                                                                                       Image.Resampling.BICUBIC),
                             dtype=np.float32)
        image = first + (texture - texture.mean()) * np.float32(rng.uniform(0.3, 1.0))
    else:  # blotches and clutter are drawn shapes on a flat or graded ground
        canvas = Image.fromarray(np.broadcast_to(first, (size, size, 3)).clip(0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(canvas)
        for _ in range(rng.integers(8, 30)):
            colour = tuple(int(c) for c in (first + rng.normal(0, 60, 3)).clip(0, 255))
            x, y = rng.uniform(0, size, 2)
            if kind == "blotches":
                rx, ry = rng.uniform(6, 40, 2)
                draw.ellipse((x - rx, y - ry, x + rx, y + ry), fill=colour)
            else:
                draw.polygon(_irregular_polygon(rng, x, y, rng.uniform(4, 16)), fill=colour)
        if kind == "blotches":
            canvas = canvas.filter(ImageFilter.GaussianBlur(rng.uniform(3, 10)))
        image = np.asarray(canvas, dtype=np.float32)
    image = image + rng.standard_normal(image.shape, dtype=np.float32) * np.float32(rng.uniform(0, 14))
    return image.astype(np.float32)


def _irregular_polygon(rng: np.random.Generator, x: float, y: float, radius: float) -> list[tuple[float, float]]:
    """Five to nine vertices at uneven angles and radii: no regular polygon, none of the classes."""
    count = int(rng.integers(5, 10))
    angles = np.sort(rng.uniform(0, 2 * math.pi, count))
    radii = radius * rng.uniform(0.35, 1.0, count)
    return [(x + r * math.cos(a), y + r * math.sin(a)) for r, a in zip(radii, angles, strict=True)]


def _distractors(rng: np.random.Generator, canvas: Image.Image) -> None:
    """Strokes, arcs, long thin bars and ellipses, and irregular blobs: clearly none of the shapes."""
    draw = ImageDraw.Draw(canvas)
    size = canvas.size[0]
    for _ in range(rng.integers(0, 7)):
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        x, y = rng.uniform(0, size, 2)
        kind = rng.integers(5)
        if kind == 0:
            # an open path of one or two segments: three could close into a triangle
            points = [(x, y)] + [tuple(float(v) for v in rng.uniform(0, size, 2)) for _ in range(rng.integers(1, 3))]
            draw.line(points, fill=colour, width=int(rng.integers(1, 5)))
        elif kind == 1:
            r, start = rng.uniform(10, 50), rng.uniform(0, 360)
            draw.arc((x - r, y - r, x + r, y + r), start, start + rng.uniform(40, 200), fill=colour,
                     width=int(rng.integers(1, 5)))
        elif kind in (2, 3):  # a bar or an ellipse at least 3.5 times as long as it is wide
            length = rng.uniform(20, 70)
            width = length / rng.uniform(3.5, 8)
            mask = Image.new("L", canvas.size, 0)
            box = (x - length / 2, y - width / 2, x + length / 2, y + width / 2)
            (ImageDraw.Draw(mask).rectangle if kind == 2 else ImageDraw.Draw(mask).ellipse)(box, fill=255)
            canvas.paste(colour, (0, 0), mask.rotate(float(rng.uniform(0, 180)), center=(x, y)))
        else:
            draw.polygon(_irregular_polygon(rng, x, y, rng.uniform(8, 24)), fill=colour)


def _object_colour(rng: np.random.Generator, under: np.ndarray, min_contrast: float = MIN_CONTRAST) -> np.ndarray:
    """A colour at a random distance from what lies under the object, darker or brighter alike. The
    distance is measured to the nearest tenth of the pixels under it, so that the object stands out
    from each part of a striped or checked surround, not only from its mean."""
    pixels = under[rng.integers(0, len(under), 64)]
    contrast = rng.uniform(min_contrast, max(min_contrast, 200.0))
    candidates = rng.uniform(0, 255, (64, 3))
    distance = np.quantile(np.linalg.norm(candidates[:, None] - pixels[None], axis=2), 0.1, axis=1)
    return candidates[np.argmin(np.abs(distance - contrast))].astype(np.float32)


def _jitter(rng: np.random.Generator, image: np.ndarray) -> np.ndarray:
    """Brightness, contrast, saturation and per-channel gain over the whole image, ``[H, W, 3]`` float."""
    mean = image.mean()
    image = (image - mean) * rng.uniform(0.8, 1.3) + mean * rng.uniform(0.75, 1.25)
    grey = image.mean(axis=2, keepdims=True)
    saturation = 0.0 if rng.random() < 0.1 else rng.uniform(0.5, 1.5)
    image = grey + (image - grey) * saturation
    return image * rng.uniform(0.85, 1.15, 3).astype(np.float32)


EASY_BACKGROUNDS = ("flat", "gradient", "smooth")


def _degrade(rng: np.random.Generator, picture: Image.Image) -> Image.Image:
    """Sometimes a blur, sometimes JPEG compression."""
    if rng.random() < 0.35:
        picture = picture.filter(ImageFilter.GaussianBlur(rng.uniform(0.4, 1.3)))
    if rng.random() < 0.5:
        buffer = io.BytesIO()
        picture.save(buffer, format="JPEG", quality=int(rng.integers(30, 95)))
        picture = Image.open(buffer).convert("RGB")
    return picture


def _grown(mask: np.ndarray, pixels: int) -> np.ndarray:
    """``mask`` dilated (``pixels`` > 0) or eroded (< 0) by a square of ``|pixels|``."""
    spread = (ImageFilter.MaxFilter if pixels > 0 else ImageFilter.MinFilter)(2 * abs(pixels) + 1)
    return np.asarray(Image.fromarray(mask.astype(np.uint8) * 255).filter(spread)) > 127


def visible_contrast(image: np.ndarray, mask: np.ndarray) -> float:
    """RGB distance of the mean colour of the object's edge (painted in every style) and of a band around it."""
    # only the object's surroundings count: filtering there alone is several times faster than the whole image
    ys, xs = np.nonzero(mask)
    rows = slice(max(int(ys.min()) - 16, 0), int(ys.max()) + 17)
    cols = slice(max(int(xs.min()) - 16, 0), int(xs.max()) + 17)
    mask = mask[rows, cols]
    edge, band = mask & ~_grown(mask, -2), _grown(mask, 6) & ~_grown(mask, 2)
    pixels = image[rows, cols].astype(np.float32)
    return float(np.linalg.norm(pixels[edge].mean(axis=0) - pixels[band].mean(axis=0)))


def generate(rng: np.random.Generator, size: int = IMAGE_SIZE, min_size: float = MIN_SIZE, max_size: float = MAX_SIZE,
             easy: bool = False) -> Sample:
    """One labelled image drawn with ``rng``; ``min_size``/``max_size`` bound the object's diameter in pixels.

    ``easy`` draws the start of a training curriculum: a filled shape at high contrast on a plain
    background, with no distractors, blur or compression (any rotation, either polarity still).
    """
    while True:
        sample = _draw(rng, size, min_size, max_size, easy)
        if visible_contrast(sample.image, sample.mask) >= MIN_VISIBLE:
            return sample


def _draw(rng: np.random.Generator, size: int, min_size: float, max_size: float, easy: bool) -> Sample:
    label = int(rng.integers(len(CLASSES)))
    pixels = _canvas(rng, size, easy)
    mask = _paint(rng, pixels, CLASSES[label], min_size, max_size, easy)
    return Sample(image=_finish(rng, pixels, easy), label=label, mask=mask, bbox=_bbox(mask))


def _canvas(rng: np.random.Generator, size: int, easy: bool) -> np.ndarray:
    """A background ``[size, size, 3]`` float32, with distractors unless ``easy``."""
    families = EASY_BACKGROUNDS if easy else BACKGROUNDS
    background = _background(rng, size, families[int(rng.integers(len(families)))])
    canvas = Image.fromarray(background.clip(0, 255).astype(np.uint8))
    if not easy:
        _distractors(rng, canvas)
    return np.asarray(canvas, dtype=np.float32).copy()


def _paint(rng: np.random.Generator, pixels: np.ndarray, kind: str, min_size: float, max_size: float, easy: bool,
           keep_clear: np.ndarray | None = None) -> np.ndarray | None:
    """Paint one ``kind`` object into ``pixels`` ``[size, size, 3]`` (in place) and return its silhouette ``[size, size]``
    bool; with ``keep_clear`` ``[size, size]`` bool, the object's box avoids it, and None when no place was found."""
    size = pixels.shape[0]
    radius = rng.uniform(min_size, max_size) / 2
    reach = radius * 1.07 + 4  # a square's corners lie 1.06 radii out
    for _ in range(100):
        cx, cy = rng.uniform(radius + 2, size - radius - 2, 2)
        x0, y0 = int(max(cx - reach, 0)), int(max(cy - reach, 0))
        x1, y1 = int(min(cx + reach + 1, size)), int(min(cy + reach + 1, size))
        if keep_clear is None or not keep_clear[y0:y1, x0:x1].any():
            break
    else:
        return None
    styles = CIRCLE_STYLES if kind in ("circle", "ring") else STYLES
    style = "filled" if easy else styles[int(rng.integers(len(styles)))]
    inner = rng.uniform(*(RING_INNER if kind == "ring" else HOLLOW_INNER))
    stroke = int(rng.integers(2, max(3, int(radius * 0.3))))
    silhouette, painted, border = _layers(kind, style, (y1 - y0, x1 - x0), cx - x0, cy - y0, radius, rng.uniform(0, 2 * math.pi),
                                          inner, stroke)
    window = pixels[y0:y1, x0:x1]
    colour = _object_colour(rng, window[silhouette > 0], min_contrast=120.0 if easy else MIN_CONTRAST)
    border_colour = _object_colour(rng, np.concatenate([window[silhouette > 0], colour[None]]))
    soft = rng.uniform(0.3, 1.0)  # anti-aliasing of the object's edges
    for layer, paint in ((painted, colour), (border, border_colour)):
        alpha = np.asarray(Image.fromarray(layer).filter(ImageFilter.GaussianBlur(soft)), dtype=np.float32)[..., None] / 255.0
        shaded = paint + rng.standard_normal(window.shape, dtype=np.float32) * np.float32(rng.uniform(0, 10))
        window = window * (1 - alpha) + shaded * alpha
    pixels[y0:y1, x0:x1] = window
    mask = np.zeros((size, size), dtype=bool)
    mask[y0:y1, x0:x1] = silhouette > 127
    return mask


def _finish(rng: np.random.Generator, pixels: np.ndarray, easy: bool) -> np.ndarray:
    """The painted canvas as the final picture ``[size, size, 3]`` uint8: jittered, and degraded unless ``easy``."""
    picture = Image.fromarray(_jitter(rng, pixels).clip(0, 255).astype(np.uint8))
    if not easy:
        picture = _degrade(rng, picture)
    return np.asarray(picture)


def _bbox(mask: np.ndarray) -> tuple[int, int, int, int]:
    ys, xs = np.nonzero(mask)
    return (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)


@dataclass(frozen=True)
class PairSample:
    """One generated image of two different shapes, apart (their boxes at least ``PAIR_GAP`` pixels from each other):
    ``image`` ``[H, W, 3]`` uint8, ``labels`` (two class indices) and ``masks`` ``[2, H, W]`` bool, one per shape."""

    image: np.ndarray
    labels: tuple[int, int]
    masks: np.ndarray

    @property
    def class_names(self) -> tuple[str, str]:
        return (CLASSES[self.labels[0]], CLASSES[self.labels[1]])


PAIR_GAP = 2 * PATCH  # two patches between the two shapes' boxes, so that masks grown by a patch (pointing) do not meet
PAIR_MAX_SIZE = 96  # two shapes must fit apart on the canvas


def generate_pair(rng: np.random.Generator, size: int = IMAGE_SIZE, min_size: float = MIN_SIZE,
                  max_size: float = PAIR_MAX_SIZE) -> PairSample:
    """Two different shapes on one background, apart, each visible against its surround."""
    while True:
        labels = tuple(int(label) for label in rng.choice(len(CLASSES), size=2, replace=False))
        pixels = _canvas(rng, size, easy=False)
        first = _paint(rng, pixels, CLASSES[labels[0]], min_size, max_size, easy=False)
        box = np.zeros_like(first)
        x0, y0, x1, y1 = _bbox(first)
        box[max(y0 - PAIR_GAP, 0) : y1 + PAIR_GAP, max(x0 - PAIR_GAP, 0) : x1 + PAIR_GAP] = True
        second = _paint(rng, pixels, CLASSES[labels[1]], min_size, max_size, easy=False, keep_clear=box)
        if second is None:
            continue
        image = _finish(rng, pixels, easy=False)
        if min(visible_contrast(image, first), visible_contrast(image, second)) >= MIN_VISIBLE:
            return PairSample(image=image, labels=labels, masks=np.stack([first, second]))


def generate_set(seed: int, count: int, size: int = IMAGE_SIZE) -> list[Sample]:
    """``count`` samples, the same for the same seed."""
    rng = np.random.default_rng(seed)
    return [generate(rng, size) for _ in range(count)]


EXAMPLES_SEED = 2026  # neither a training seed nor the held-out one


HARD_CASE = "hard-case"  # in an example's file name: the model gets it wrong, and the app says so


def write_examples(folder: Path, seed: int = EXAMPLES_SEED, predict: Callable[[np.ndarray], str] | None = None,
                   tries: int = 200) -> list[Path]:
    """One generated image of each class as ``NN-class.png`` in ``folder`` (the app's examples), NN the order in which the
    classes first appear.

    With ``predict`` (an image ``[H, W, 3]`` → a class name: the trained model), an example is the first image of its class
    that the model gets right, and each first image it got wrong is kept too, as ``NN-class-hard-case.png`` after the
    others (a user sees what the model does well first, and one mistake labelled as one). A class whose first ``tries``
    images are all wrong is written as its hard case alone."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.png"):
        stale.unlink()
    rng = np.random.default_rng(seed)
    order: list[int] = []  # class labels in the order of their first image
    right: dict[int, Sample] = {}
    hard: dict[int, Sample] = {}
    seen: dict[int, int] = {}
    while any(label not in right and seen.get(label, 0) < tries for label in range(len(CLASSES))):
        sample = generate(rng)
        if sample.label in right or seen.get(sample.label, 0) >= tries:
            continue
        if sample.label not in seen:
            order.append(sample.label)
        seen[sample.label] = seen.get(sample.label, 0) + 1
        if predict is None or predict(sample.image) == sample.class_name:
            right[sample.label] = sample
        elif sample.label not in hard:
            hard[sample.label] = sample
    named = [(f"{order.index(label):02d}-{right[label].class_name}.png", right[label]) for label in order if label in right]
    named += [(f"{len(order) + index:02d}-{hard[label].class_name}-{HARD_CASE}.png", hard[label])
              for index, label in enumerate(label for label in order if label in hard)]
    for name, sample in named:
        Image.fromarray(sample.image).save(folder / name)
    return sorted(folder / name for name, _ in named)


def example_class(path: Path) -> tuple[str, bool]:
    """The class an example's file name names (``NN-class[-hard-case].png``) and whether it is a hard case."""
    name = path.stem.split("-", 1)[1]
    return name.removesuffix(f"-{HARD_CASE}"), name.endswith(f"-{HARD_CASE}")


def write_set(folder: Path, count: int, seed: int, objects: int = 1) -> None:
    """``count`` generated images as ``folder/images/CLASS/NNNNNN.png`` (the ImageFolder convention) and their
    masks as ``folder/masks/CLASS/NNNNNN.png`` (white on the object), the same for the same seed.

    With ``objects=2``, two different shapes per image: ``folder/images/A+B/NNNNNN.png`` and one mask per shape,
    ``folder/masks/A+B/NNNNNN/A.png`` and ``.../B.png``."""
    if objects == 2:
        rng = np.random.default_rng(seed)
        for index in range(count):
            pair = generate_pair(rng)
            name = "+".join(pair.class_names)
            path = folder / "images" / name / f"{index:06d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(pair.image).save(path)
            for class_name, mask in zip(pair.class_names, pair.masks, strict=True):
                mask_path = folder / "masks" / name / f"{index:06d}" / f"{class_name}.png"
                mask_path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(mask.astype(np.uint8) * 255).save(mask_path)
        return
    if objects != 1:
        raise VitExplorerError(f"make-shapes draws 1 or 2 objects per image, not {objects}")
    for index, sample in enumerate(generate_set(seed, count)):
        for kind, picture in (("images", sample.image), ("masks", sample.mask.astype(np.uint8) * 255)):
            path = folder / kind / sample.class_name / f"{index:06d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(picture).save(path)
