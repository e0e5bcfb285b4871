"""Each head's direct output in the joint image-text space (``core.embedding_parts``): the parts add up to the image
embedding the library computes, and each head's vector read along a prompt gives that head's share of the prompt's
logit as the decomposition (``core.decomposition``, tested on its own) gives it."""

import numpy as np
import pytest
import torch
from conftest import photo
from test_clip_families import tiny_hf, tiny_open_clip

from vit_explorer import VitExplorerError, load_model
from vit_explorer.core.analysis import analyze, class_evidence, pixels_of
from vit_explorer.core.embedding_parts import embedding_parts
from vit_explorer.core.targets import Prompts, prompt_model

PROMPTS = ("a red star", "a blue circle on the left", "two squares")


def shapes_clip():
    model = load_model("builtin:shapes-clip", device="cpu")
    return model, None


FAMILIES = {"shapes-clip": shapes_clip, "open_clip": tiny_open_clip, "hf-clip": lambda: tiny_hf("clip")}


@pytest.fixture(params=sorted(FAMILIES))
def family(request):
    return request.param, *FAMILIES[request.param]()


def pixels_for(model, count: int) -> torch.Tensor:
    return torch.cat([pixels_of(model, analyze(model, photo((90, 70), seed=seed), explain=False)) for seed in range(count)])


def test_the_parts_add_up_to_the_embedding_the_library_computes(family):
    name, model, own_logits = family
    pixels = pixels_for(model, 3)
    parts = embedding_parts(model, pixels)
    layers, heads = model.map_shape
    assert parts.heads.shape == (3, layers, heads, parts.embedding.shape[1])
    np.testing.assert_allclose(parts.total.numpy(), parts.embedding.numpy(), atol=1e-5 * float(parts.embedding.abs().max()))
    # the embedding is the library's: its own image-text logits come from it
    prompted = prompt_model(model, Prompts(PROMPTS))
    texts, text = prompted.adapter.texts.double(), model.text
    logits = text.logit_scale * torch.nn.functional.normalize(parts.embedding, dim=-1) @ texts.T + text.logit_bias
    expected = (own_logits(pixels, PROMPTS) if own_logits is not None
                else prompted.adapter.logits(prompted.module, pixels)).double()
    np.testing.assert_allclose(logits.numpy(), expected.detach().numpy(), rtol=1e-4, atol=1e-4)
    assert parts.heads.abs().sum() > 0 and parts.mlps.abs().sum() > 0


def test_a_head_read_along_a_prompt_is_its_share_of_the_prompt_logit(family):
    """With the cosine's length held at the image's own, a prompt's logit is scale · ⟨embedding, text⟩ / ‖embedding‖ +
    bias, so each head's share of it is scale · ⟨head's vector, text⟩ / ‖embedding‖: the decomposition's number."""
    name, model, _ = family
    prompted = prompt_model(model, Prompts(PROMPTS))
    image = photo((80, 80), seed=11)
    analysis = analyze(prompted, image, explain=False)
    parts = embedding_parts(model, pixels_of(model, analysis))
    for target in range(len(PROMPTS)):
        decomposition = class_evidence(prompted, analysis, target, decompose=True).decomposition
        along = model.text.logit_scale * parts.heads[0] @ prompted.adapter.texts[target].double() / parts.embedding[0].norm()
        np.testing.assert_allclose(along.numpy(), decomposition.heads.double().numpy(), rtol=1e-3,
                                   atol=1e-4 * float(decomposition.heads.abs().max()))


def test_siglip_attention_pooling_is_refused_with_its_reason():
    model, _ = tiny_hf("siglip")
    with pytest.raises(VitExplorerError, match="do not add up|not affine"):
        embedding_parts(model, pixels_for(model, 1))


def test_a_classifier_s_answer_splits_per_image_as_the_decomposition_splits_it():
    """``score_readout``: each image's top-class logit, split for a batch at once, equals the decomposition of that
    image alone."""
    from vit_explorer.core.embedding_parts import score_readout

    model = load_model("builtin:shapes", device="cpu")
    analyses = [analyze(model, photo((90, 70), seed=seed), decompose=True) for seed in range(3)]
    parts = embedding_parts(model, torch.cat([pixels_of(model, analysis) for analysis in analyses]), score_readout)
    for index, analysis in enumerate(analyses):
        evidence = class_evidence(model, analysis, decompose=True)
        assert int(parts.targets[index]) == evidence.target == int(analysis.probs.argmax())
        np.testing.assert_allclose(parts.heads[index, :, :, 0].numpy(), evidence.decomposition.heads.double().numpy(),
                                   atol=1e-4 * float(evidence.decomposition.heads.abs().max()))
        assert float(parts.embedding[index, 0]) == pytest.approx(evidence.decomposition.score, rel=1e-5)
    assert len(parts.maps) == model.map_shape[0]
    assert parts.maps[0].shape == (3, model.map_shape[1], model.layout.num_tokens, model.layout.num_tokens)
