import pytest
import torch

from vit_explorer.models.layout import TokenLayout

LAYOUTS = [
    TokenLayout((), (4, 3), (16, 16)),
    TokenLayout(("cls",), (14, 14), (16, 16)),
    TokenLayout(("cls", "dist"), (7, 5), (16, 16)),
    TokenLayout(("cls", "reg1", "reg2", "reg3", "reg4"), (37, 37), (14, 14)),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: f"{layout.num_prefix_tokens}prefix")
def test_patch_tokens_and_maps_round_trip(layout):
    rows, cols = layout.grid_hw
    row = torch.arange(layout.num_tokens, dtype=torch.float32)
    grid = layout.patch_map(row)
    assert grid.shape == (rows, cols)
    for r, c in [(0, 0), (rows - 1, cols - 1), (rows // 2, cols - 1)]:
        token = layout.patch_token(r, c)
        assert grid[r, c] == token
        assert layout.token_patch(token) == (r, c)
    assert all(layout.token_patch(t) is None for t in range(layout.num_prefix_tokens))
    assert layout.input_hw == (rows * layout.patch_hw[0], cols * layout.patch_hw[1])


def test_patch_map_refuses_rows_of_the_wrong_length():
    with pytest.raises(ValueError, match="expected 197 tokens"):
        LAYOUTS[1].patch_map(torch.zeros(196))


def test_token_names():
    layout = LAYOUTS[2]
    assert layout.token_name(1) == "dist"
    assert layout.token_name(layout.patch_token(2, 3)) == "patch at row 2, col 3"  # 7 rows × 5 cols: (2, 3) reads one way only
    assert not LAYOUTS[0].has_class_token and LAYOUTS[3].has_class_token
