"""The per-image scoreboard: each entry equals the single-map score computed on its own, chance equals the random
orders' curves, the badge equals the sanity check's end point."""

import numpy as np
import pytest
from conftest import TINY, photo, write_backbone_checkpoint, write_checkpoint

from vit_explorer import VitExplorerError, analyze, load_model
from vit_explorer.core.analysis import class_evidence
from vit_explorer.core.curves import BLUR, ROAD
from vit_explorer.core.maps import CLASS_METHODS, RolloutOptions, class_map
from vit_explorer.core.ranking import Entry
from vit_explorer.methods.faithfulness import deletion_insertion
from vit_explorer.methods.sanity import sanity_check
from vit_explorer.methods.scoreboard import batches, scoreboard


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = load_model(str(write_checkpoint(tmp_path_factory.mktemp("board") / "tiny.safetensors", TINY, seed=4)))
    return model, analyze(model, photo((64, 64), seed=2))


@pytest.mark.parametrize("protocol", [BLUR, ROAD], ids=lambda protocol: protocol.name)
def test_entries_equal_each_maps_own_score_and_are_ranked(tiny, protocol):
    model, analysis = tiny
    calls = []
    board = scoreboard(model, analysis, 1, protocol=protocol, steps=4, random_orders=3, seed=5, batch_size=16,
                       step=lambda: calls.append(1))
    assert len(calls) == batches(len(CLASS_METHODS), 4, 3, protocol, 16) + analysis.map_shape[0]
    score_of = {entry.method: entry.score for entry in board.entries}
    assert [entry.method for entry in board.entries] == sorted(CLASS_METHODS, key=lambda m: -score_of[m])
    evidence = class_evidence(model, analysis, 1)
    for entry in board.entries:
        curves = deletion_insertion(model, analysis.image, class_map(analysis, entry.method, evidence, RolloutOptions()), 1,
                                    steps=4, random_orders=3, protocol=protocol, seed=5)
        aucs = curves.aucs
        # ROAD draws its noise per batch, and the board batches every method together: its curves differ by the noise
        tolerance = 0.05 if protocol == ROAD else 1e-5
        assert entry.deletion == pytest.approx(aucs["deletion"], abs=tolerance)
        assert entry.insertion == pytest.approx(aucs["insertion"], abs=tolerance)
        # the areas by the trapezoid rule written out over the curves computed alone; the score as the protocol's paper defines it
        step = np.diff(curves.fractions.numpy())
        curves_area = {name: float((step * (getattr(curves, name).numpy()[1:] + getattr(curves, name).numpy()[:-1]) / 2).sum())
                       for name in ("deletion", "insertion")}
        expected = {"blur": curves_area["insertion"] - curves_area["deletion"],
                    "road": (curves_area["insertion"] - curves_area["deletion"]) / 2}
        assert entry.score == pytest.approx(expected[protocol.name], abs=2 * tolerance)
    if protocol == BLUR:  # chance: the mean of the random orders' insertion − deletion
        assert board.chance_mean == pytest.approx(aucs["random_insertion"] - aucs["random_deletion"], abs=1e-5)
    assert board.chance_sd > 0
    record = board.as_dict()
    assert record["curves"] == {"blur": {"deletion": "deletion", "insertion": "insertion"},
                                "road": {"deletion": "MoRF", "insertion": "LeRF"}}[protocol.name]
    assert [row["method"] for row in record["ranking"]] == [entry.method for entry in board.entries]


def test_the_badge_is_the_sanity_checks_end_point(tiny):
    model, analysis = tiny
    board = scoreboard(model, analysis, 1, steps=2, random_orders=2, seed=3)
    final = sanity_check(model, analysis, 1, seed=3).final  # the cascade, every layer: the same draws
    for entry in board.entries:
        assert entry.randomised_rho == pytest.approx(final[entry.method], abs=1e-6)
    # the badge by hand: a map still ranked like the trained one (ρ ≥ 0.5) does not depend on the weights; a constant one
    # (NaN: no ranking) is not called independent of them
    badges = [Entry("m", 0.0, 0.0, 0.0, 0.0, rho).depends_on_weights for rho in (0.49, 0.5, 0.93, -0.2, float("nan"))]
    assert badges == [True, False, False, True, True]


def test_a_backbone_is_scored_by_its_similarity_target(tmp_path):
    from vit_explorer.core.analysis import pixels_of
    from vit_explorer.core.targets import similarity_model

    backbone = load_model(str(write_backbone_checkpoint(tmp_path / "backbone.safetensors", TINY)))
    analysis = analyze(backbone, photo((64, 64)))
    with pytest.raises(VitExplorerError, match="no classifier head"):
        scoreboard(backbone, analysis)
    similarity = similarity_model(backbone, pixels_of(backbone, analysis))
    scored = analyze(similarity, photo((64, 64)))
    board = scoreboard(similarity, scored, steps=4, seed=5)
    assert board.measure == "share of the image's score" and board.target_label == "similarity to the image's own embedding"
    evidence = class_evidence(similarity, scored, 0)
    for entry in board.entries:  # each entry is that map's own score, as a share of the image's
        curves = deletion_insertion(similarity, scored.image, class_map(scored, entry.method, evidence, RolloutOptions()), 0,
                                    steps=4, random_orders=3, seed=5)
        assert curves.measure == board.measure and curves.deletion[0] == pytest.approx(1.0)
        assert entry.deletion == pytest.approx(curves.aucs["deletion"], abs=1e-5)


def similarity_of_patch(backbone, image, want_negative: bool):
    """A similarity model and its analysis whose score on ``image`` is negative (or positive): the image's embedding
    projected on the direction of a patch's output token, the first patch whose sign is the one wanted (a patch's own
    token projected on its own direction is its length, never negative)."""
    import dataclasses

    from vit_explorer.core.analysis import pixels_of
    from vit_explorer.core.targets import SimilarityAdapter, similarity_model

    analysis = analyze(backbone, image)
    rows, cols = analysis.grid
    for row in range(rows):
        for col in range(cols):
            patch = similarity_model(backbone, pixels_of(backbone, analysis), (row, col))
            # the same direction, read off the pooled embedding instead of the patch's token
            similarity = dataclasses.replace(patch, adapter=SimilarityAdapter(backbone.adapter, patch.adapter.reference))
            scored = analyze(similarity, image)
            if (float(scored.logits[0]) < 0) == want_negative:
                return similarity, scored
    pytest.fail("no patch of that sign")


def test_a_negative_reference_score_is_not_ranked_and_says_why(tmp_path):
    """A patch whose similarity to the image is negative: a share of it flips sign, so the board ranks nothing and says
    so, and the single score is not judged either."""
    backbone = load_model(str(write_backbone_checkpoint(tmp_path / "backbone.safetensors", TINY)))
    similarity, scored = similarity_of_patch(backbone, photo((64, 64)), want_negative=True)
    board = scoreboard(similarity, scored, steps=4, seed=5)
    assert "negative" in board.unranked and [entry.method for entry in board.entries] == list(CLASS_METHODS)
    assert board.as_dict()["ranked"] is False
    curves = deletion_insertion(similarity, scored.image, class_map(scored, "rollout", None, RolloutOptions()), 0, steps=4)
    assert curves.deletion[0] == pytest.approx(-1.0) and "negative" in curves.warning
    assert curves.verdict == "cannot be judged" and not curves.beats_chance(margin=-10.0)
    from vit_explorer.draw.report import scoreboard_section
    from vit_explorer.draw.terminal import scoreboard_lines

    lines = scoreboard_lines(board)
    assert "NOT RANKED" in lines[0] and lines[1].startswith("not ranked: the image's own score is negative")
    assert all(not line.startswith("1.") for line in lines)
    assert "<td>—</td>" in scoreboard_section(board) and "Not ranked" in scoreboard_section(board)


def test_a_positive_reference_is_ranked(tmp_path):
    backbone = load_model(str(write_backbone_checkpoint(tmp_path / "backbone.safetensors", TINY)))
    similarity, scored = similarity_of_patch(backbone, photo((64, 64)), want_negative=False)
    curves = deletion_insertion(similarity, scored.image, class_map(scored, "rollout", None, RolloutOptions()), 0, steps=4)
    if float(curves.deletion.abs().max()) <= 5:  # a clearly scored image: nothing to warn about
        assert curves.warning == ""


@pytest.mark.timm
def test_chance_without_spread_gives_no_distance_from_it():
    """The issue's case: random-weight DINOv2 (LayerScale 1e-5: every block adds almost nothing), explained for its own
    embedding; chance scores 0.000 ± 0.000, and no method may be said to stand 41 sd from it."""
    pytest.importorskip("timm")
    from vit_explorer.core.analysis import pixels_of
    from vit_explorer.core.targets import similarity_model
    from vit_explorer.draw.terminal import scoreboard_lines
    from vit_explorer.web.captions import board_rows

    backbone = load_model("timm:vit_small_patch14_dinov2@random", input_hw=(56, 56))
    image = photo((56, 56), seed=3)
    # its own embedding, which the near-identity blocks leave at the class token's own value whatever the patches show
    similarity = similarity_model(backbone, pixels_of(backbone, analyze(backbone, image)))
    scored = analyze(similarity, image)
    board = scoreboard(similarity, scored, steps=4, seed=5)
    assert board.chance_sd < 1e-3 and board.notes and "do not spread" in board.notes[0]
    assert all(entry.over_chance != entry.over_chance for entry in board.entries)  # NaN: no distance
    assert all(row[3] == "—" for row in board_rows(board))
    assert not any(" sd from chance" in line for line in scoreboard_lines(board))
