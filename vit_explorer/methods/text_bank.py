"""The bank of descriptions TextSpan chooses from (``methods.text_span``), written by the project itself: short image
descriptions from templates over colours, textures, shapes, materials, positions, counts, sizes, scenes and objects,
and the model's own class names where it has them. No third party's sentence file is copied.

The sentences are plain and literal on purpose: TextSpan names a head by the bank's direction nearest to what the head
writes, so the bank should span what images vary in (what is where, how many, how big, what colour, what surface, what
setting) in words a text tower reads. It includes every kind of caption the shipped shapes-CLIP was trained on (a shape,
its size, its side, a pair, a count), in the forms it was trained on. A user's own bank replaces it (``--text-bank``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vit_explorer.errors import VitExplorerError

COLOURS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white", "grey", "gold")
SHAPES = ("circle", "square", "triangle", "star", "ring", "cross", "rectangle", "line", "dot", "heart", "arrow", "spiral")
SIZES = ("small", "large", "tiny", "huge")
SIDES = ("left", "right", "top", "bottom")
REGIONS = ("in the centre", "in a corner", "near the edge", "in the top left", "in the bottom right", "in the foreground",
           "in the background", "close up", "far away")
NUMBERS = ("one", "two", "three", "four", "five", "many")
TEXTURES = ("striped", "spotted", "checkered", "furry", "smooth", "rough", "wooden", "shiny", "matte", "wrinkled", "grainy",
            "blurry", "sharp", "glossy", "woven", "scaly", "feathered", "rusty", "wet", "dusty")
MATERIALS = ("wood", "metal", "glass", "stone", "plastic", "paper", "fabric", "leather", "water", "ice", "sand", "grass",
             "concrete", "brick", "rubber", "wool", "ceramic", "gold", "snow", "cardboard")
SCENES = ("at the beach", "in a forest", "in a city street", "in a kitchen", "in a living room", "in an office",
          "on a farm", "in the mountains", "in the desert", "under water", "in the snow", "at night", "at sunset",
          "indoors", "outdoors", "in a field", "in a park", "on a road", "in the sky", "in a garden", "in a museum",
          "in a shop", "in a classroom", "in a stadium", "on a table", "on the floor", "against a plain background",
          "in the rain", "in fog", "in bright sunlight")
OBJECTS = ("dog", "cat", "bird", "horse", "fish", "car", "bicycle", "boat", "aeroplane", "train", "person", "child", "face",
           "hand", "tree", "flower", "house", "bridge", "chair", "table", "cup", "bottle", "book", "phone", "computer",
           "clock", "lamp", "shoe", "hat", "ball", "apple", "banana", "bread", "cake", "pizza", "guitar", "umbrella",
           "door", "window", "mountain", "river", "cloud", "road sign", "letter", "number", "logo", "painting",
           "drawing", "map", "toy")
STYLES = ("a photo", "a drawing", "a painting", "a sketch", "a cartoon", "a diagram", "a close-up photo", "an aerial photo",
          "a black and white photo", "a blurry photo", "a dark photo", "a bright photo", "a low resolution image",
          "a pattern", "a texture", "a screenshot", "a render", "a pixelated image", "a colourful image", "an empty image")


def plural(word: str) -> str:
    """``word``'s plural, by the English rule for the nouns here (a cross, crosses)."""
    return f"{word}es" if word.endswith(("s", "x", "sh", "ch")) else f"{word}s"


def shape_captions(shapes: Sequence[str]) -> list[str]:
    """The shapes-CLIP's caption kinds (a shape, its size, its side, a pair, a count) over ``shapes``, and colours."""
    lines = []
    for shape in shapes:
        lines += [f"a {shape}", f"a photo of a {shape}", *(f"a {size} {shape}" for size in SIZES)]
        lines += [f"the {shape} {'on the' if side in ('left', 'right') else 'at the'} {side}" for side in SIDES]
        lines += [f"a {colour} {shape}" for colour in COLOURS]
        lines += [f"a {size} {colour} {shape}" for size in SIZES[:2] for colour in COLOURS[:6]]
        lines += [f"a {shape} and a {other}" for other in shapes if other != shape]
    lines += [f"{number} {'shape' if number == 'one' else 'shapes'}" for number in NUMBERS]
    return lines


def default_bank(labels: Sequence[str] | None = None) -> list[str]:
    """The project's bank: a few thousand descriptions (module doc), the model's class names ``labels`` included, each
    once, in a fixed order."""
    lines = [*shape_captions(SHAPES)]
    lines += [f"{style} of a {thing}" for style in STYLES for thing in OBJECTS[::2]]
    lines += [f"a {colour} {thing}" for colour in COLOURS for thing in OBJECTS]
    lines += [f"a {size} {thing}" for size in SIZES for thing in OBJECTS]
    lines += [f"a {thing} {scene}" for thing in OBJECTS[:25] for scene in SCENES[::3]]
    lines += [f"a photo taken {scene}" for scene in SCENES]
    lines += [f"a {texture} surface" for texture in TEXTURES] + [f"something {texture}" for texture in TEXTURES]
    lines += [f"a {texture} {thing}" for texture in TEXTURES for thing in OBJECTS[::5]]
    lines += [f"an object made of {material}" for material in MATERIALS]
    lines += [f"a {material} {thing}" for material in MATERIALS for thing in OBJECTS[1::5]]
    lines += [f"an object {region}" for region in REGIONS] + [f"a {thing} {region}" for thing in OBJECTS[::4]
                                                              for region in REGIONS]
    lines += [f"{number} {plural(thing)}" for number in NUMBERS[1:] for thing in OBJECTS[::3]]
    lines += [f"a {colour} background" for colour in COLOURS] + [f"mostly {colour}" for colour in COLOURS]
    lines += [f"{style}" for style in STYLES]
    if labels:
        lines += [line for label in labels for line in (f"a {label}", f"a photo of a {label}", f"a {label} on the left",
                                                       f"a {label} on the right", f"two {plural(label)}")]
    return list(dict.fromkeys(line.strip() for line in lines if line.strip()))


def read_bank(path: str | Path) -> list[str]:
    """A user's bank: one description per line, blank lines and repeats dropped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise VitExplorerError(f"cannot read the text bank {path}: {error}") from None
    texts = list(dict.fromkeys(line.strip() for line in lines if line.strip()))
    if not texts:
        raise VitExplorerError(f"the text bank {path} holds no description (one per line)")
    return texts
