"""The run layer: a request answered once, and everything drawn and written from the run without the model."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY, photo, write_backbone_checkpoint, write_checkpoint

from vit_explorer import VitExplorerError, load_model
from vit_explorer.core.curves import ROAD
from vit_explorer.core.maps import CLASS_METHODS
from vit_explorer.core.request import Request
from vit_explorer.core.targets import Target
from vit_explorer.run import run


class Disarmed(AssertionError):
    pass


@pytest.fixture
def armed(monkeypatch):
    """Arms a trap on a model: once armed, any forward pass of it, and any backward pass anywhere, raises."""
    state = {"armed": False}

    def arm(model) -> None:
        def forward(*_):
            if state["armed"]:
                raise Disarmed("the model ran after the run returned")

        model.module.register_forward_pre_hook(forward)
        grad, backward = torch.autograd.grad, torch.Tensor.backward

        def no_grad(*args, **kwargs):
            if state["armed"]:
                raise Disarmed("a backward pass ran after the run returned")
            return grad(*args, **kwargs)

        def no_backward(self, *args, **kwargs):
            if state["armed"]:
                raise Disarmed("a backward pass ran after the run returned")
            return backward(self, *args, **kwargs)

        monkeypatch.setattr(torch.autograd, "grad", no_grad)
        monkeypatch.setattr(torch.Tensor, "backward", no_backward)
        state["armed"] = True

    return arm


def test_after_a_run_every_view_and_file_is_drawn_without_the_model(tmp_path, armed):
    """Everything a report shows, AttnLRP and LeGrad included, comes from the run: with the model armed to raise on any
    pass, every file of ``analyze --html`` with every option is written and every class map drawn."""
    from vit_explorer.draw import files, pictures

    model = load_model(str(write_checkpoint(tmp_path / "tiny.safetensors", TINY, seed=3)))
    request = Request(method="attnlrp", every_map=True, overview=True, score=True, steps=4, random_orders=2, scoreboard=True,
                      sanity=True, ablation="zero", norms=True)
    result = run(model, photo((64, 64), seed=4), request)
    assert set(result.maps) == set(CLASS_METHODS) and result.curves is not None and result.scoreboard is not None
    assert result.sanity is not None and result.ablation is not None and result.norms is not None
    armed(model)
    with pytest.raises(Disarmed):  # the trap is live
        model.logits(torch.zeros(1, 3, 64, 64))
    written, _ = files.write_analysis(result, tmp_path / "out", html=True)
    assert {path.name for path in written} >= {"report.html", "attnlrp.png", "faithfulness.json", "scoreboard.json", "sanity.png",
                                               "ablation.png", "norms.png", "rollout.png", "heads.png", "attention.npz"}
    for method in CLASS_METHODS:
        assert pictures.run_map_picture(result, method).ndim == 3
    # the maps it drew are the maps the run computed, not others made on the way
    torch.testing.assert_close(result.maps["attnlrp"].map, result.evidence.method_maps["attnlrp"])
    # what the colour bars say of a map is computed with it: AttnLRP's relevance over its score, in both senses
    relevance, score = result.maps["attnlrp"], float(result.analysis.logits[result.evidence.target])
    assert relevance.conserved == pytest.approx(float(relevance.map.sum()) / score)
    assert relevance.strength == pytest.approx(float(relevance.map.abs().sum()) / abs(score))
    assert result.maps["rollout"].strength is None and result.maps["rollout"].conserved is None


def test_a_run_answers_exactly_what_was_asked(tmp_path):
    from vit_explorer.draw import pictures

    model = load_model(str(write_checkpoint(tmp_path / "tiny.safetensors", TINY, seed=3)))
    image = photo((64, 64), seed=4)
    plain = run(model, image, Request(method="rollout"))
    assert plain.evidence is None and set(plain.maps) == {"rollout"} and plain.curves is None and plain.scoreboard is None
    assert plain.overview is None
    with pytest.raises(VitExplorerError, match="did not compute the cls map"):  # drawing never computes a map
        pictures.run_map_picture(plain, "cls")
    named = run(model, image,
                Request(method="legrad", target=Target("thing 2"), score=True, protocol=ROAD, steps=2, random_orders=1))
    assert named.evidence.target == 2 and named.target_label == "thing 2" and set(named.evidence.method_maps) == {"legrad"}
    assert named.curves.protocol == ROAD and named.curves.curve_names == ("MoRF", "LeRF") and named.curves.target == 2
    steps = []
    run(model, image, Request(method="relevance", ablation="zero"), progress=lambda text, total,
        unit: steps.append((text, total, unit)) or
        (lambda: None))
    assert steps[0] == ("analysing the image", 0, "")  # a line, before the pass
    assert [(total, unit) for _, total, unit in steps[1:]] == [(3, "layer")] and steps[1][0].startswith("head ablation (zero)")


def test_a_backbone_gets_its_similarity_target_in_one_place(tmp_path):
    backbone = load_model(str(write_backbone_checkpoint(tmp_path / "backbone.safetensors", TINY)))
    image = photo((64, 64), seed=4)
    with pytest.raises(VitExplorerError, match="no classifier head, so it has no class 'cat'"):
        run(backbone, image, Request(target=Target("cat")))
    agnostic = run(backbone, image, Request(method="rollout"))
    assert agnostic.evidence is None and not agnostic.analysis.similarity  # nothing asked needs a target
    patch = run(backbone, image, Request(method="attnlrp", target=Target((1, 2))))
    assert patch.analysis.similarity and patch.target_label == "patch (row 1, col 2): its own output token"
    own = run(backbone, image, Request(method="relevance", score=True, steps=2, random_orders=1))
    assert own.target_label == "similarity to the image's own embedding" and own.curves.measure == "share of the image's score"
    classifier = load_model(str(write_checkpoint(tmp_path / "tiny.safetensors", TINY)))
    with pytest.raises(VitExplorerError, match="a patch target"):
        run(classifier, image, Request(target=Target((1, 2))))
