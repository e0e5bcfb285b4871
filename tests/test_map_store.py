"""The map store: full and compact maps answer the same questions, and a compact one says when it needs the model (the
store derived from queries and keys: test_derived_maps)."""

import pytest
import torch

from vit_explorer import VitExplorerError, analyze, load_model
from vit_explorer.core.analysis import recompute_query_rows
from vit_explorer.core.statistics import HEAD_STATISTICS


def test_full_and_compact_stores_give_the_same_rows_statistics_and_head_means(tiny_checkpoint, image_file, maps_only):
    model = load_model(str(tiny_checkpoint))
    full = analyze(model, image_file).store
    compact = analyze(model, image_file, memory_budget=1).store  # above twice the budget: compact
    assert full.full_bytes > 0 and compact.full_bytes == 0 and full.shape == compact.shape == (3, 4)
    for token in (None, 0):  # the mean of patch queries, the class token
        torch.testing.assert_close(compact.query_rows(token), full.query_rows(token), atol=1e-3, rtol=0)
    for name in HEAD_STATISTICS:
        torch.testing.assert_close(compact.head_statistic(name), full.head_statistic(name), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(compact.head_means().float(), full.head_means(), atol=1e-3, rtol=0)
    # the full store's compact form is the reduction the compact store kept as its layers arrived
    torch.testing.assert_close(full.compact_form()["head_mean"].float(), compact.head_means().float(), atol=1e-3, rtol=0)
    assert full.keeps_every_head and not compact.keeps_every_head


def test_a_compact_store_asks_for_the_model_once_per_patch_query(tiny_checkpoint, image_file, maps_only):
    model = load_model(str(tiny_checkpoint))
    full = analyze(model, image_file)
    compact = analyze(model, image_file, memory_budget=1)
    patch = compact.layout.patch_token(1, 2)
    assert not compact.store.keeps_rows_of(patch) and full.store.keeps_rows_of(patch)
    with pytest.raises(VitExplorerError, match="recompute_query_rows"):
        compact.store.query_rows(patch)
    calls = []
    model.module.register_forward_pre_hook(lambda *_: calls.append(1))
    rows = recompute_query_rows(model, compact, patch)
    assert compact.store.keeps_rows_of(patch) and len(calls) == 1
    torch.testing.assert_close(rows, full.store.query_rows(patch), atol=1e-6, rtol=0)
    recompute_query_rows(model, compact, patch)
    assert len(calls) == 1  # kept: no second pass
