"""The training pieces that run in every step (never training itself: that is not for CI): windows keep
their place in the whole image's grid through the augmentation, the window forward is the model's own on
whole images, and the locality-biased start attends nearer than the default one."""

import numpy as np
import torch

from vit_explorer.core import statistics
from vit_explorer.core.capture import StackingSink, capture
from vit_explorer.models.layout import TokenLayout
from vit_explorer.models.vit import ViT
from vit_explorer.shapes.train import SHAPES_VIT, _window_offset, augment, locality_init, tokens_and_logits

GRID, WINDOW_ROWS, PATCH = 16, 8, 16


def test_augmented_window_is_the_window_of_the_augmented_whole_image_at_its_new_offset():
    whole = torch.randn(6, 3, GRID * PATCH, GRID * PATCH)
    whole_classes = torch.arange(GRID * GRID).view(1, GRID, GRID).repeat(6, 1, 1)  # each patch names itself
    offsets = torch.tensor([[0, 0], [8, 8], [3, 5], [8, 0], [0, 7], [2, 2]])
    windows = torch.stack([whole[i, :, r * PATCH : (r + WINDOW_ROWS) * PATCH, c * PATCH : (c + WINDOW_ROWS) * PATCH]
                           for i, (r, c) in enumerate(offsets.tolist())])
    window_classes = torch.stack([whole_classes[i, r : r + WINDOW_ROWS, c : c + WINDOW_ROWS] for i,
                                  (r, c) in enumerate(offsets.tolist())])
    for seed in range(12):  # every turn, with and without the flip
        whole_out, whole_classes_out, _ = augment(whole, whole_classes, torch.zeros_like(offsets), np.random.default_rng(seed))
        window_out, window_classes_out, moved = augment(windows, window_classes, offsets, np.random.default_rng(seed))
        for i, (r, c) in enumerate(moved.tolist()):
            assert 0 <= r <= GRID - WINDOW_ROWS and 0 <= c <= GRID - WINDOW_ROWS
            assert torch.equal(window_out[i],
                               whole_out[i, :, r * PATCH : (r + WINDOW_ROWS) * PATCH, c * PATCH : (c + WINDOW_ROWS) * PATCH])
            assert torch.equal(window_classes_out[i], whole_classes_out[i, r : r + WINDOW_ROWS, c : c + WINDOW_ROWS])


def test_window_offset_is_patch_aligned_and_holds_the_object():
    rng = np.random.default_rng(0)
    for bbox in [(0, 0, 30, 30), (200, 190, 256, 256), (60, 70, 185, 190), (100, 10, 140, 50)]:
        for _ in range(20):
            top, left = _window_offset(rng, bbox, 128)
            assert top % PATCH == 0 and left % PATCH == 0 and 0 <= top <= 128 and 0 <= left <= 128
            if bbox[2] - bbox[0] <= 128 - PATCH and bbox[3] - bbox[1] <= 128 - PATCH:
                assert left <= bbox[0] and bbox[2] <= left + 128 and top <= bbox[1] and bbox[3] <= top + 128


def test_window_forward_on_whole_images_is_the_model_forward():
    torch.manual_seed(0)
    model = ViT(**dict(SHAPES_VIT, depth=2)).eval()
    images = torch.randn(2, 3, 256, 256)
    tokens, logits = tokens_and_logits(model, images, torch.zeros(2, 2, dtype=torch.long))
    assert tokens.shape == (2, GRID * GRID, SHAPES_VIT["dim"])
    torch.testing.assert_close(logits, model(images))


def test_window_forward_uses_the_position_embedding_block_where_the_window_lies():
    torch.manual_seed(1)
    model = ViT(**dict(SHAPES_VIT, depth=1)).eval()
    whole = torch.randn(1, 3, 256, 256)
    # the window at patch (4, 6) of a whole image whose other patches are the window's: tokens see only positions
    window = whole[:, :, 4 * PATCH : 12 * PATCH, 6 * PATCH : 14 * PATCH]
    with torch.no_grad():
        _, from_window = tokens_and_logits(model, window, torch.tensor([[4, 6]]))
        patches = model.to_patch_embedding(window) + model.pos_embedding[1:].view(GRID, GRID, -1)[4:12, 6:14].reshape(64, -1)
        x = torch.cat([model.cls_token[None] + model.pos_embedding[:1], patches], dim=1)
        expected = model.mlp_head(model.transformer(x)[:, 0])
    torch.testing.assert_close(from_window, expected)


def mean_distance_at_start(model: ViT) -> float:
    layout = TokenLayout(("cls",), (GRID, GRID), (PATCH, PATCH))
    captured = capture(model.eval(), 0.1 * torch.randn(4, 3, 256, 256), StackingSink(len(model.transformer.layers)))
    first_layer = captured.kept[:, 0]  # [b, heads, n, n]
    return float(statistics.mean_attention_distance(first_layer, layout).mean())


def test_locality_init_starts_heads_nearer_than_the_default_init():
    torch.manual_seed(2)
    default = ViT(**dict(SHAPES_VIT, depth=2))
    local = ViT(**dict(SHAPES_VIT, depth=2))
    locality_init(local, torch.Generator().manual_seed(2))
    assert mean_distance_at_start(local) < 0.8 * mean_distance_at_start(default)  # measured: 0.68 (91 against 133 px)
