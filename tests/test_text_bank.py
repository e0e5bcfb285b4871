"""The project's own text bank (``methods.text_bank``)."""

import pytest

from vit_explorer.errors import VitExplorerError
from vit_explorer.methods.text_bank import default_bank, read_bank
from vit_explorer.shapes.captions import NUMBERS, SIDES, Caption
from vit_explorer.shapes.generator import CLASSES


def test_the_bank_holds_every_caption_the_shapes_clip_was_trained_on_and_the_model_s_labels():
    bank = default_bank(["zebra", "cross"])
    assert 2000 <= len(bank) <= 5000 and len(set(bank)) == len(bank)
    trained = [Caption("has", (shape,)) for shape in range(len(CLASSES))]
    trained += [Caption("sized", (shape,), size) for shape in range(len(CLASSES)) for size in ("small", "large")]
    trained += [Caption("side", (shape,), side) for shape in range(len(CLASSES)) for side in SIDES]
    trained += [Caption("pair", (first, second)) for first in range(len(CLASSES)) for second in range(len(CLASSES))
                if first != second]
    trained += [Caption("count", word=word) for word in NUMBERS]
    assert [caption.text for caption in trained if caption.text not in bank] == []
    assert "a photo of a zebra" in bank and "two crosses" in bank and "two crosss" not in bank
    assert default_bank() == default_bank()  # the same bank every time


def test_a_user_bank_is_read_one_description_per_line(tmp_path):
    path = tmp_path / "bank.txt"
    path.write_text("a red car\n\n  a red car \na dog\n", encoding="utf-8")
    assert read_bank(path) == ["a red car", "a dog"]
    path.write_text("\n \n", encoding="utf-8")
    with pytest.raises(VitExplorerError, match="no description"):
        read_bank(path)
    with pytest.raises(VitExplorerError, match="cannot read"):
        read_bank(tmp_path / "missing.txt")
