"""Targets beyond classes: a backbone's similarity score, checked against the embedding computed apart."""

import pytest
import torch
from conftest import TINY, photo, write_backbone_checkpoint, write_checkpoint

from vit_explorer import VitExplorerError, analyze, explain, load_model
from vit_explorer.core.analysis import pixels_of
from vit_explorer.core.attnlrp import input_relevance
from vit_explorer.core.maps import CLASS_SPECIFIC
from vit_explorer.core.targets import similarity_model


@pytest.fixture
def backbone(tmp_path):
    return load_model(str(write_backbone_checkpoint(tmp_path / "backbone.safetensors", TINY)))


def tokens_apart(model, pixels):
    """The final tokens ``[n, dim]`` from the seed ViT's own modules, not through the adapter."""
    module = model.module
    x = module.to_patch_embedding(pixels)
    x = torch.cat((module.cls_token.expand(1, -1, -1), x), dim=1) + module.pos_embedding[: x.shape[1] + 1]
    return module.transformer(x)[0]  # the Transformer ends in its norm


def test_the_own_embedding_score_is_the_embeddings_length_and_a_patch_score_its_own_tokens(backbone):
    image = photo((64, 64), seed=3)
    pixels = pixels_of(backbone, analyze(backbone, image))
    with torch.no_grad():
        tokens = tokens_apart(backbone, pixels)
    own = similarity_model(backbone, pixels)
    assert own.labels == ["similarity to the image's own embedding"] and own.num_classes == 1
    assert float(own.logits(pixels)[0, 0]) == pytest.approx(float(tokens[0].norm()), rel=1e-5)
    patch = similarity_model(backbone, pixels, (2, 1))
    index = backbone.layout.patch_token(2, 1)
    token = tokens[index]
    assert patch.labels == ["patch (row 2, col 1): its own output token"]
    # on the image, the patch's own token on its own direction: its length; on another image, that image's token there
    assert float(patch.logits(pixels)[0, 0]) == pytest.approx(float(token.norm()), rel=1e-5)
    # the reference stays fixed: another image is scored against the same direction
    other = pixels_of(backbone, analyze(backbone, photo((64, 64), seed=9)))
    with torch.no_grad():
        other_tokens = tokens_apart(backbone, other)
    assert float(own.logits(other)[0, 0]) == pytest.approx(float(other_tokens[0] @ tokens[0] / tokens[0].norm()), rel=1e-5)
    assert float(patch.logits(other)[0, 0]) == pytest.approx(float(other_tokens[index] @ token / token.norm()), rel=1e-5,
                                                             abs=1e-6)
    with pytest.raises(VitExplorerError, match="outside the 4×4 patch grid"):
        similarity_model(backbone, pixels, (4, 0))


def test_every_class_specific_method_explains_a_backbone(backbone):
    image = photo((64, 64), seed=3)
    for method in CLASS_SPECIFIC:
        for target in (None, (1, 2)):
            explanation = explain(image, backbone, method, target)
            assert explanation.map.shape == (4, 4) and explanation.map.isfinite().all() and explanation.map.abs().sum() > 0
            assert explanation.probability is None
            assert explanation.target.startswith("similarity to" if target is None else "patch (row 1")
    html = explain(image, backbone, "attnlrp")._repr_html_()
    assert "not a probability" in html and "100.0%" not in html
    with pytest.raises(VitExplorerError, match="no class 'cat'"):
        explain(image, backbone, "relevance", "cat")


def test_attnlrp_conserves_the_similarity_score(backbone):
    with torch.no_grad():
        for name, parameter in backbone.module.named_parameters():
            if name.endswith("bias") or name in ("cls_token", "pos_embedding"):
                parameter.zero_()
    pixels = pixels_of(backbone, analyze(backbone, photo((64, 64), seed=5)))
    scored = similarity_model(backbone, pixels, (3, 3))
    assert float(input_relevance(scored, pixels, 0).sum()) == pytest.approx(float(scored.logits(pixels)[0, 0]), rel=1e-4,
                                                                            abs=1e-5)


def test_a_classifier_takes_classes_not_patches(tmp_path):
    model = load_model(str(write_checkpoint(tmp_path / "tiny.safetensors", TINY)))
    with pytest.raises(VitExplorerError, match="patch target"):
        explain(photo((64, 64)), model, "relevance", (1, 1))


def test_another_image_target_is_the_embedding_on_the_second_images_direction(backbone, tmp_path):
    """The retrieval question: image A's embedding projected on the direction of B's, checked against both images'
    embeddings computed apart; the same question asked of B gives a map of B; a classifier refuses it."""
    from vit_explorer.core.request import Request
    from vit_explorer.core.targets import OtherImage, Target
    from vit_explorer.run import run

    first, second = photo((64, 64), seed=3), photo((64, 64), seed=9)
    second_path = tmp_path / "second.png"
    second.save(second_path)
    target = Target.parse(f"image:{second_path}")
    assert target.other == OtherImage(second_path, "second.png")
    result = run(backbone, first, Request(method="attnlrp", target=target))
    with torch.no_grad():
        embedding_a = tokens_apart(backbone, pixels_of(backbone, analyze(backbone, first)))[0]
        embedding_b = tokens_apart(backbone, pixels_of(backbone, analyze(backbone, second)))[0]
    assert result.target_label == "similarity to second.png's embedding"
    assert float(result.analysis.logits[0]) == pytest.approx(float(embedding_a @ embedding_b / embedding_b.norm()), rel=1e-5)
    assert result.maps["attnlrp"].map.shape == (4, 4) and result.maps["attnlrp"].map.abs().sum() > 0
    # asked of B about A: B's embedding on A's direction, another map
    back = run(backbone, second, Request(method="attnlrp", target=Target(OtherImage(first, "first"))))
    assert float(back.analysis.logits[0]) == pytest.approx(float(embedding_a @ embedding_b / embedding_a.norm()), rel=1e-5)
    assert not torch.allclose(back.maps["attnlrp"].map, result.maps["attnlrp"].map)
    with pytest.raises(VitExplorerError, match="no image file"):
        Target.parse(f"image:{tmp_path / 'missing.png'}")
    classifier = load_model(str(write_checkpoint(tmp_path / "tiny.safetensors", TINY)))
    with pytest.raises(VitExplorerError, match="second image as the target is for a backbone"):
        run(classifier, first, Request(method="relevance", target=target))


def test_every_capture_adapter_method_a_readout_does_not_compute_reaches_the_wrapped_adapter():
    """A readout (a backbone's similarity, a CLIP model's prompts) wraps its family's adapter: every method it does not
    compute itself is the wrapped one's, overrides included. Forwarded by hand, ``layer_outputs`` and ``branched``
    silently ran CaptureAdapter's defaults instead of the family's."""
    import inspect

    from vit_explorer.core.targets import SimilarityAdapter
    from vit_explorer.models.base import CaptureAdapter

    calls = []

    class Recording:
        def __getattr__(self, name):
            return lambda *args, **kwargs: calls.append((name, args, kwargs)) or name

    readout = SimilarityAdapter(Recording(), torch.ones(4))
    computed = {"classify", "layer_readout", "logits", "attached", "edited", "recorded_inputs", "matches", "num_classes"}
    methods = [name for name, member in vars(CaptureAdapter).items() if inspect.isfunction(member) and not name.startswith("_")]
    assert {"layer_outputs", "branched", "blocks", "pool"} <= set(methods) - computed
    for name in sorted(set(methods) - computed):
        calls.clear()
        assert getattr(readout, name)("module", 7, key="value") == name
        assert calls == [(name, ("module", 7), {"key": "value"})], name
