"""Decode any image a user may have into RGB, safely, and turn it into a model's input."""

from __future__ import annotations

import io
import re
import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import Preprocess

MAX_PIXELS = 40_000_000  # ~ a 7700×5200 photo; larger files are refused before their pixels are decoded
MAX_ASPECT = 50  # beyond this a resize to the model's input leaves nothing recognisable
INTERPOLATIONS = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}

ImageSource = str | Path | bytes | Image.Image


def _open(source: ImageSource, name: str) -> Image.Image:
    if isinstance(source, Image.Image):
        return source
    if isinstance(source, bytes):
        stream: io.BytesIO | Path = io.BytesIO(source)
    else:
        stream = Path(source).expanduser()
        if stream.is_dir():
            raise VitExplorerError(f"{name} is a folder: give one image file in it (a folder of images is for `stats` and "
                                   "`evaluate`)")
        if not stream.is_file():
            raise VitExplorerError(f"{name}: no such file")
    try:
        with warnings.catch_warnings():
            # Pillow's own bomb warning (above 89 MP) comes before our lower cap, which ``load_image`` applies to the size
            # the header declares; its error (above 179 MP) is answered in the same words
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(stream)
    except Image.DecompressionBombError as error:
        declared = re.search(r"\((\d+) pixels\)", str(error))
        pixels = f"{int(declared.group(1)):,} pixels" if declared else "its size"
        raise VitExplorerError(f"{name}: {pixels} is more than the {MAX_PIXELS:,} this tool decodes") from None
    except UnidentifiedImageError:
        raise VitExplorerError(f"{name}: not an image file that Pillow can read") from None
    except OSError as error:
        raise VitExplorerError(f"{name}: image data is damaged or truncated ({error})") from None


def _to_rgb(image: Image.Image) -> Image.Image:
    """RGB with alpha composited on white; 16-bit and float modes scaled to 8 bits, not clipped."""
    if image.mode in {"I;16", "I;16B", "I;16L", "I", "F"}:
        values = np.asarray(image, dtype=np.float64)
        low, high = float(values.min()), float(values.max())
        scaled = (values - low) / (high - low) * 255.0 if high > low else np.zeros_like(values)
        image = Image.fromarray(scaled.astype(np.uint8), mode="L")
    if image.mode == "P":
        image = image.convert("RGBA")
    if image.mode in {"RGBA", "LA", "PA"} or "transparency" in image.info:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def load_image(source: ImageSource, name: str | None = None) -> Image.Image:
    """Decode ``source`` (path, bytes or PIL image) into an upright RGB image.

    Applies EXIF orientation, takes the first frame of animations, converts grayscale, palette,
    CMYK, 16-bit and alpha images. Raises ``VitExplorerError`` for anything that is not a usable
    image: unreadable, truncated, too many pixels (checked before decoding), or absurd proportions.
    """
    name = name or (str(source) if isinstance(source, (str, Path)) else "image")
    image = _open(source, name)
    width, height = image.size
    if width * height > MAX_PIXELS:
        raise VitExplorerError(f"{name}: {width}×{height} pixels is more than the {MAX_PIXELS:,} this tool decodes")
    if min(width, height) < 1 or max(width, height) > MAX_ASPECT * min(width, height):
        raise VitExplorerError(f"{name}: {width}×{height} is too narrow to analyse (aspect ratio above {MAX_ASPECT}:1)")
    try:
        image.seek(0)
        image.load()
        image = ImageOps.exif_transpose(image) or image
        return _to_rgb(image)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise VitExplorerError(f"{name}: image data is damaged or truncated ({error})") from None


FITS = ("stretch", "pad")  # how an image of other proportions meets the model's input


def model_view(image: Image.Image, preprocess: Preprocess, fit: str = "stretch") -> np.ndarray:
    """The RGB image as the model sees it ``[H, W, 3]`` uint8: resized to the model's input, either
    stretched (``"stretch"``, the whole image, proportions changed) or letterboxed (``"pad"``, the whole
    image at its own proportions, centred on its mean colour)."""
    height, width = preprocess.input_hw
    try:
        resample = INTERPOLATIONS[preprocess.interpolation]
    except KeyError:
        raise VitExplorerError(f"unknown interpolation {preprocess.interpolation!r}; use one of "
                               f"{sorted(INTERPOLATIONS)}") from None
    if fit == "stretch":
        return np.asarray(image.resize((width, height), resample), dtype=np.uint8)
    if fit != "pad":
        raise VitExplorerError(f"unknown fit {fit!r}; use one of {', '.join(FITS)}")
    scale = min(width / image.width, height / image.height)
    inner = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    mean = tuple(int(c) for c in np.asarray(image, dtype=np.float64).reshape(-1, 3).mean(axis=0).round())
    canvas = Image.new("RGB", (width, height), mean)
    canvas.paste(image.resize(inner, resample), ((width - inner[0]) // 2, (height - inner[1]) // 2))
    return np.asarray(canvas, dtype=np.uint8)


def fit_note(source_wh: tuple[int, int], input_hw: tuple[int, int], fit: str) -> str:
    """One line on how an image of ``source_wh`` pixels became the model's ``input_hw`` input; empty when it
    already was that input's size (nothing changed, so there is nothing to say)."""
    width, height = source_wh
    described = f"{width}×{height} image"
    if (height, width) == tuple(input_hw):
        return ""
    if width * input_hw[0] == height * input_hw[1]:
        return f"{described} resized to {input_hw[1]}×{input_hw[0]}"
    if fit == "pad":
        return f"{described} padded to the model's {input_hw[1]}×{input_hw[0]} proportions with its mean colour (letterbox)"
    change = (width / height) / (input_hw[1] / input_hw[0])
    return (f"{described} stretched to {input_hw[1]}×{input_hw[0]} (proportions changed {max(change, 1 / change):.2f}×; "
            "nothing cropped); pad to square keeps its proportions")


def to_pixels(view: np.ndarray, preprocess: Preprocess) -> torch.Tensor:
    """``[H, W, 3]`` uint8 → normalised model input ``[1, 3, H, W]`` float32."""
    pixels = torch.from_numpy(np.array(view, dtype=np.uint8)).permute(2, 0, 1).float().div_(255.0)
    mean = torch.tensor(preprocess.mean).view(3, 1, 1)
    std = torch.tensor(preprocess.std).view(3, 1, 1)
    return ((pixels - mean) / std).unsqueeze(0)
