"""The per-image scoreboard: each entry equals the single-map score computed on its own, chance equals the random
orders' curves, the badge equals the sanity check's end point."""

import pytest
from conftest import TINY, photo, write_backbone_checkpoint, write_checkpoint

from vit_explorer import VitExplorerError, analyze, load_model
from vit_explorer.core.analysis import class_evidence
from vit_explorer.core.maps import CLASS_METHODS, RolloutOptions, class_map
from vit_explorer.methods.faithfulness import deletion_insertion
from vit_explorer.methods.sanity import sanity_check
from vit_explorer.methods.scoreboard import batches, scoreboard


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = load_model(str(write_checkpoint(tmp_path_factory.mktemp("board") / "tiny.safetensors", TINY, seed=4)))
    return model, analyze(model, photo((64, 64), seed=2))


@pytest.mark.parametrize("baseline", ["blur", "road"])
def test_entries_equal_each_maps_own_score_and_are_ranked(tiny, baseline):
    model, analysis = tiny
    calls = []
    board = scoreboard(model, analysis, 1, baseline=baseline, steps=4, random_orders=3, seed=5, batch_size=16, step=lambda: calls.append(1))
    assert len(calls) == batches(len(CLASS_METHODS), 4, 3, baseline, 16) + analysis.map_shape[0]
    assert [entry.method for entry in board.entries] == sorted(CLASS_METHODS, key=lambda m: -next(e.score for e in board.entries if e.method == m))
    evidence = class_evidence(model, analysis, 1)
    for entry in board.entries:
        curves = deletion_insertion(model, analysis.image, class_map(analysis, entry.method, evidence, RolloutOptions()), 1,
                                    steps=4, random_orders=3, baseline=baseline, seed=5)
        aucs = curves.aucs
        # ROAD draws its noise per batch, and the board batches every method together: its curves differ by the noise
        tolerance = 0.05 if baseline == "road" else 1e-5
        assert entry.deletion == pytest.approx(aucs["deletion"], abs=tolerance)
        assert entry.insertion == pytest.approx(aucs["insertion"], abs=tolerance)
        assert entry.score == pytest.approx((entry.insertion - entry.deletion) / (2 if baseline == "road" else 1))
    if baseline == "blur":  # chance: the mean of the random orders' insertion − deletion
        assert board.chance_mean == pytest.approx(aucs["random_insertion"] - aucs["random_deletion"], abs=1e-5)
    assert board.chance_sd > 0
    record = board.as_dict()
    assert record["curves"] == ({"deletion": "MoRF", "insertion": "LeRF"} if baseline == "road" else {"deletion": "deletion", "insertion": "insertion"})
    assert [row["method"] for row in record["ranking"]] == [entry.method for entry in board.entries]


def test_the_badge_is_the_sanity_checks_end_point(tiny):
    model, analysis = tiny
    board = scoreboard(model, analysis, 1, steps=2, random_orders=2, seed=3)
    final = sanity_check(model, analysis, 1, seed=3).final  # the cascade, every layer: the same draws
    for entry in board.entries:
        assert entry.randomised_rho == pytest.approx(final[entry.method], abs=1e-6)
        assert entry.depends_on_weights == (not final[entry.method] >= 0.5)


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
