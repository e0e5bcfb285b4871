import io

import numpy as np
import pytest
from conftest import photo
from PIL import Image

from vit_explorer import VitExplorerError
from vit_explorer.core.images import MAX_PIXELS, fit_note, load_image, model_view, to_pixels
from vit_explorer.models.base import Preprocess


def encoded(image: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def png_header_claiming(width: int, height: int) -> bytes:
    """A PNG whose header declares width×height but holds no pixel data (a decompression bomb's signature)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def test_grayscale_palette_rgba_cmyk_and_16_bit_become_rgb():
    base = photo((40, 30))
    sixteen = Image.fromarray(np.asarray(base.convert("L"), dtype=np.uint16) * 257)
    rgba = base.convert("RGBA")
    rgba.putalpha(0)  # fully transparent: composited on white
    for image in [base.convert("L"), base.convert("P"), base.convert("CMYK"), sixteen, rgba]:
        decoded = load_image(encoded(image, "PNG" if image.mode != "CMYK" else "JPEG"))
        assert decoded.mode == "RGB" and decoded.size == (40, 30)
    assert np.asarray(load_image(encoded(rgba, "PNG"))).min() == 255
    sixteen_rgb = np.asarray(load_image(encoded(sixteen, "PNG")))
    assert sixteen_rgb.max() == 255 and sixteen_rgb.min() < 64  # scaled to 8 bits, not clipped to white


def test_exif_orientation_is_applied():
    image = photo((40, 20))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise on display
    decoded = load_image(encoded(image, "JPEG", exif=exif.tobytes()))
    assert decoded.size == (20, 40)


def test_animated_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (16, 16), colour) for colour in ((255, 0, 0), (0, 0, 255))]
    data = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100)
    assert np.asarray(load_image(data))[0, 0].tolist() == [255, 0, 0]


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "not an image"),
        (b"<svg xmlns='http://www.w3.org/2000/svg'></svg>", "not an image"),
        (np.random.default_rng(0).bytes(4096), "not an image"),
        (encoded(photo((64, 64)), "PNG")[:300], "damaged or truncated"),
        (encoded(photo((64, 64)), "JPEG")[:400], "damaged or truncated"),
        (png_header_claiming(50_000, 50_000), "2,500,000,000 pixels is more than the 40,000,000 this tool decodes"),
        (png_header_claiming(10_000, 9_500), "10000×9500 pixels is more than the 40,000,000 this tool decodes"),
        (png_header_claiming(8000, 6000), "8000×6000 pixels is more than"),
        (encoded(Image.new("RGB", (4000, 3)), "PNG"), "too narrow"),
    ],
    ids=["empty", "svg", "random", "truncated-png", "truncated-jpeg", "bomb", "pillow-bomb-warning", "over-cap", "aspect"],
)
def test_unusable_files_raise_one_error_type(data, message):
    assert 8000 * 6000 > MAX_PIXELS
    with pytest.raises(VitExplorerError) as raised:
        load_image(data, name="upload.png")
    # the project's own words, never Pillow's ("could be decompression bomb DOS attack") between 89 and 179 megapixels
    assert message in str(raised.value) and "DOS" not in str(raised.value)


def test_a_folder_given_as_the_image_says_it_is_a_folder(tmp_path):
    with pytest.raises(VitExplorerError, match="is a folder: give one image file in it"):
        load_image(tmp_path)


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(VitExplorerError, match="nowhere.png: no such file"):
        load_image(tmp_path / "nowhere.png")


def test_model_view_and_pixels_follow_the_preprocess_config():
    preprocess = Preprocess(input_hw=(48, 64), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    view = model_view(photo((100, 30)), preprocess)
    assert view.shape == (48, 64, 3) and view.dtype == np.uint8
    pixels = to_pixels(view, preprocess)
    assert pixels.shape == (1, 3, 48, 64)
    np.testing.assert_allclose(pixels[0, :, 0, 0].numpy(), (view[0, 0] / 255.0 - 0.5) / 0.25, rtol=1e-5)


def test_tiny_multi_frame_and_transparent_palette_images_are_converted():
    one_pixel = load_image(encoded(Image.new("RGB", (1, 1), (10, 20, 30)), "PNG"))
    assert one_pixel.size == (1, 1) and one_pixel.getpixel((0, 0)) == (10, 20, 30)
    frames = [Image.new("L", (20, 10), level) for level in (40, 200)]
    tiff = load_image(encoded(frames[0], "TIFF", save_all=True, append_images=frames[1:]))
    assert tiff.mode == "RGB" and tiff.getpixel((0, 0)) == (40, 40, 40)
    palette = Image.new("P", (8, 8), 0)
    palette.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    palette.info["transparency"] = 0
    assert load_image(encoded(palette, "PNG", transparency=0)).getpixel((0, 0)) == (255, 255, 255)


def test_html_renamed_png_is_refused(tmp_path):
    path = tmp_path / "page.png"
    path.write_text("<!doctype html><html><body><script>alert(1)</script></body></html>")
    with pytest.raises(VitExplorerError, match="page.png: not an image"):
        load_image(path)


@pytest.mark.parametrize(("source_wh", "input_hw", "note"), [
    ((256, 256), (256, 256), ""),  # nothing changed: nothing said
    ((512, 512), (256, 256), "512×512 image resized to 256×256"),
    ((640, 480), (224, 224), "640×480 image stretched to 224×224 (proportions changed 1.33×"),
    ((640, 480), (480, 640), ""),  # (height, width) input, the image's own size
])
def test_the_view_note_says_what_changed_and_nothing_when_nothing_did(source_wh, input_hw, note):
    said = fit_note(source_wh, input_hw, "stretch")
    assert said.startswith(note) and (said == "") == (note == "")
