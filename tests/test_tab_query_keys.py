"""The Queries and keys tab: one head's queries and keys in one picture, recorded once per analysis, and a click on a
query point makes it the query."""

import re

import gradio as gr
import pytest
import torch
from app_support import CONTROLS, analysed, by_name, forward_counter, opened

from vit_explorer.core.analysis import queries_and_keys
from vit_explorer.core.query_key_embedding import joint_embedding
from vit_explorer.web.session import ModelCache
from vit_explorer.web.tabs import query_keys, shared

QUERY_KEYS = "Queries and keys"


def points(svg: str) -> tuple[list[tuple[float, float]], list[tuple[float, float]], list[int]]:
    """The SVG's key centres, and its query centres in token order with the tokens their points carry (the query's own
    point is drawn last)."""
    keys = [(float(x), float(y)) for x, y in re.findall(r'<circle class="k" cx="([\d.]+)" cy="([\d.]+)" r="4"', svg)]
    queries = sorted((int(token), float(x), float(y))
                     for token, x, y in re.findall(r'<circle class="q" data-token="(\d+)" cx="([\d.]+)" cy="([\d.]+)"', svg))
    return keys, [(x, y) for _, x, y in queries], [token for token, _, _ in queries]


def test_the_tab_draws_every_token_twice_records_queries_and_keys_once_and_a_query_click_sets_the_query(checkpoint, upload):
    models = ModelCache()
    session, _ = analysed(models, upload, checkpoint)
    calls = forward_counter(models, checkpoint)
    views = opened(QUERY_KEYS, session)
    layout = session.analysis.layout
    keys, queries, tokens = points(views["qk_plot"])
    assert len(keys) == len(queries) == layout.num_tokens and tokens == list(range(layout.num_tokens))
    assert "<title>query · cls (click: make it the query)</title>" in views["qk_plot"]
    assert "<title>key · patch at row 0, col 1</title>" in views["qk_plot"]
    assert "Layer 0, head 0" in views["qk_caption"] and "PCA (torch.linalg.svd)" in views["qk_caption"]
    assert "every attention weight is unchanged" in views["qk_caption"] and "The query (cls) is ringed" in views["qk_caption"]
    assert len(calls) == 1  # the analysis kept its maps whole: one fused pass for the queries and keys

    # the picture is the embedding of layer 1, head 1's own queries and keys, drawn on one scale for both axes
    chosen = by_name(query_keys.on_choice(session, 1, "h1", "pca", "row", *CONTROLS), query_keys.CHOSEN)
    inputs = queries_and_keys(models.get(checkpoint), session.analysis)
    expected = joint_embedding(inputs.queries[1, 1], inputs.keys[1, 1])
    drawn_keys, drawn_queries, _ = points(chosen["qk_plot"])
    both = torch.cat([expected.queries, expected.keys])
    drawn = torch.tensor(drawn_queries + drawn_keys)
    # the drawing is the embedding moved, scaled by one factor and flipped upside down: distances keep their ratios
    ratio = torch.pdist(drawn) / torch.pdist(both.double()).float()
    assert float(ratio.std() / ratio.mean()) < 0.01
    assert "Layer 1, head 1" in chosen["qk_caption"] and len(calls) == 1  # no second pass

    # a click on a query point makes its token the query, and the tab rings it
    patch = layout.patch_token(1, 2)
    clicked = by_name(shared.on_query_token(models, gr.SelectData(None, {"index": patch, "value": str(patch)}), session,
                                            QUERY_KEYS, *CONTROLS), shared.QUERIED)
    assert session.query == patch
    assert "The query (patch at row 1, col 2) is ringed" in clicked["qk_caption"]
    ringed = re.search(rf'data-token="{patch}" cx="([\d.]+)" cy="([\d.]+)" r="(\d)"', clicked["qk_plot"])
    assert ringed.group(3) == "6"
    # drawn last, with the image's highlight ring around it
    mark = f'<circle class="mark" cx="{ringed.group(1)}" cy="{ringed.group(2)}" r="12"'
    assert mark in clicked["qk_plot"].split(f'data-token="{patch}"')[1] and clicked["qk_plot"].endswith("</svg>")


def test_a_token_outside_the_image_is_refused(checkpoint, upload):
    models = ModelCache()
    session, _ = analysed(models, upload, checkpoint)
    outside = session.analysis.layout.num_tokens
    with pytest.raises(gr.Error, match=f"token {outside} is not one of this image's {outside} tokens"):
        shared.on_query_token(models, gr.SelectData(None, {"index": outside, "value": None}), session, QUERY_KEYS, *CONTROLS)


def test_a_folder_sample_draws_every_images_tokens_in_one_picture(checkpoint, upload, tmp_path):
    from conftest import photo

    models = ModelCache()
    session, _ = analysed(models, upload, checkpoint)
    opened(QUERY_KEYS, session)
    folder = tmp_path / "sample"
    folder.mkdir()
    for seed in range(5):
        photo((120, 90), seed=seed).save(folder / f"image{seed}.png")
    sample = by_name(query_keys.on_sample(models, session, str(folder), 3, *CONTROLS), ("state", *query_keys.SAMPLE))
    tokens = session.analysis.layout.num_tokens
    svg = sample["qk_sample_plot"]
    assert svg.count("<title>") == 2 * 3 * tokens and "data-token" not in svg  # no click: the query is this image's
    assert "image0.png · query · cls" in svg and "image3.png · key · patch at row 0, col 0" in svg  # evenly spaced: 0, 1, 3
    assert "**Layer 0, head 0 over 3 images** (image0.png, image1.png, image3.png)" in sample["qk_sample_caption"]
    assert opened(QUERY_KEYS, session)["qk_sample_plot"] == svg  # kept with the tab's state: drawn again as it was
    with pytest.raises(gr.Error, match="give a folder of images"):
        query_keys.on_sample(models, session, " ", 3, *CONTROLS)
