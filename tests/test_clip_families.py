"""CLIP and SigLIP image towers of OpenCLIP and Hugging Face with random weights: text prompts as targets, checked against
each library's own forward pass (the logits it gives an image and a text), and every method explaining a prompt."""

import numpy as np
import pytest
import torch
from conftest import assert_class_maps_work, photo

from vit_explorer import VitExplorerError, analyze, load_model
from vit_explorer.core import maps
from vit_explorer.core.analysis import class_evidence, pixels_of
from vit_explorer.core.attnlrp import input_relevance
from vit_explorer.core.request import Request
from vit_explorer.core.targets import Prompts, Target, prompt_model
from vit_explorer.models.text import byte_tokens
from vit_explorer.run import run

open_clip = pytest.importorskip("open_clip")
transformers = pytest.importorskip("transformers")

PROMPTS = ("a photo of a dog", "a red star", "the circle on the left")
VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "image_size": 32,
          "patch_size": 8}
TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 300,
        "max_position_embeddings": 16, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def tiny_open_clip(seed: int = 0):
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    from vit_explorer.models.open_clip_adapter import from_open_clip

    torch.manual_seed(seed)
    model = CLIP(embed_dim=16, vision_cfg=CLIPVisionCfg(layers=3, width=32, head_width=8, patch_size=8, image_size=32),
                 text_cfg=CLIPTextCfg(context_length=16, vocab_size=300, width=32, heads=4, layers=2))
    with torch.no_grad():  # a logit bias as SigLIP's, so that the test sees it used
        model.logit_bias = torch.nn.Parameter(torch.tensor(-1.5))
    loaded = from_open_clip(model, "open_clip:tiny", random_weights=True)

    def own_logits(pixels: torch.Tensor, prompts: tuple[str, ...]) -> torch.Tensor:
        tokens = byte_tokens(list(prompts), 16, 300, start=None, end=299)
        image_logits, _ = model.get_logits(pixels, tokens)
        return image_logits

    return loaded, own_logits


def tiny_hf(kind: str, seed: int = 0):
    from vit_explorer.models.hf_clip_adapter import from_hf_clip

    torch.manual_seed(seed)
    if kind == "clip":
        config = transformers.CLIPConfig(vision_config=VISION, text_config=TEXT, projection_dim=16)
        full = transformers.CLIPModel._from_config(config, attn_implementation="sdpa")
    else:
        full = transformers.SiglipModel._from_config(transformers.SiglipConfig(vision_config=VISION, text_config=TEXT),
                                                     attn_implementation="sdpa")
    loaded = from_hf_clip(full.eval(), f"hf:tiny-{kind}", random_weights=True)

    def own_logits(pixels: torch.Tensor, prompts: tuple[str, ...]) -> torch.Tensor:
        start, end = (None, None) if kind == "siglip" else (1, 2)
        ids = byte_tokens(list(prompts), 16, 300, start=start, end=end, pad=0)
        return full(pixel_values=pixels, input_ids=ids).logits_per_image

    return loaded, own_logits


FAMILIES = {"open_clip": tiny_open_clip, "hf-clip": lambda seed=0: tiny_hf("clip", seed),
            "hf-siglip": lambda seed=0: tiny_hf("siglip", seed)}


@pytest.fixture(params=sorted(FAMILIES))
def family(request):
    return request.param, *FAMILIES[request.param]()


def test_prompt_scores_equal_the_library_own_image_text_logits(family):
    """The prompt model's logits are the library's own image–text logits (its fused forward, its pooling, projection,
    normalisation, scale and bias), before, during and after a capture."""
    name, loaded, own_logits = family
    prompted = prompt_model(loaded, Prompts(PROMPTS))
    image = photo((40, 40))
    analysis = analyze(prompted, image)
    pixels = pixels_of(prompted, analysis)
    with torch.no_grad():
        expected = own_logits(pixels, PROMPTS)[0]
    torch.testing.assert_close(analysis.logits, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(analysis.probs, expected.softmax(-1), rtol=1e-4, atol=1e-5)  # the zero-shot prediction
    assert [prediction.label for prediction in analysis.top_k(3)] == [PROMPTS[i] for i in expected.argsort(descending=True)]
    assert analysis.layout.prefix_names == (() if name == "hf-siglip" else ("cls",))
    # every captured row is a distribution over the keys
    rows = analysis.attentions.sum(dim=-1)
    torch.testing.assert_close(rows, torch.ones_like(rows), rtol=1e-4, atol=1e-4)


def test_every_method_explains_a_prompt(family):
    _, loaded, _ = family
    assert_class_maps_work(prompt_model(loaded, Prompts(PROMPTS)), photo((40, 40)))


def test_a_prompt_target_runs_every_result_and_names_the_prompt(family):
    name, loaded, _ = family
    request = Request(method="attnlrp", target=Target(Prompts(PROMPTS, chosen=2)), every_map=True, score=True, steps=2,
                      random_orders=1, sanity=True, ablation="zero", scoreboard=True, decompose=name != "hf-siglip")
    result = run(loaded, photo((40, 40)), request)
    assert result.evidence.target == 2 and result.target_label == PROMPTS[2]
    assert set(result.maps) == set(maps.CLASS_METHODS)
    assert result.curves is not None and result.sanity is not None and result.ablation is not None
    assert {entry.method for entry in result.scoreboard.entries} == set(maps.CLASS_METHODS)
    assert result.scoreboard.target_label == PROMPTS[2]
    if name != "hf-siglip":
        parts = result.decomposition
        assert parts.total == pytest.approx(parts.score, rel=1e-4, abs=1e-4)
        assert parts.score == pytest.approx(float(result.analysis.logits[2]), rel=1e-4, abs=1e-5)


def test_siglip_pooling_head_is_refused_by_the_decomposition_with_its_reason():
    loaded, _ = tiny_hf("siglip")
    with pytest.raises(VitExplorerError, match="read-out is not affine"):
        run(loaded, photo((40, 40)), Request(target=Target(Prompts(PROMPTS)), decompose=True))


@pytest.mark.parametrize("name", ["open_clip", "hf-clip"])
def test_attnlrp_conserves_the_prompt_logit_when_nothing_adds_a_bias(name):
    """With every bias, the class embedding and the position embedding at zero and the logit bias at zero, the score is
    positively homogeneous in the pixels under the rules (the cosine's length held like a LayerNorm's), so the input
    relevance sums to the prompt's logit."""
    loaded, _ = FAMILIES[name](seed=4)
    with torch.no_grad():
        for parameter_name, parameter in loaded.module.named_parameters():
            embedding = any(part in parameter_name for part in ("class_embedding", "positional_embedding", "position_embedding"))
            if parameter_name.endswith("bias") or embedding:
                parameter.zero_()
    loaded = dataclass_replace_text_bias(loaded)
    prompted = prompt_model(loaded, Prompts(PROMPTS))
    pixels = torch.randn(1, 3, 32, 32)
    logits = prompted.logits(pixels)[0]
    for target in range(len(PROMPTS)):
        assert float(input_relevance(prompted, pixels, target).sum()) == pytest.approx(float(logits[target]), rel=1e-4, abs=1e-5)


def dataclass_replace_text_bias(loaded):
    import dataclasses

    return dataclasses.replace(loaded, text=dataclasses.replace(loaded.text, logit_bias=0.0))


def test_similarity_targets_still_work_on_an_image_tower():
    """A CLIP image tower is also a backbone: its embedding and a clicked patch are targets as for DINOv2."""
    loaded, _ = tiny_open_clip()
    for target in (None, (1, 2)):
        result = run(loaded, photo((40, 40)), Request(method="legrad", target=Target(target)))
        assert result.analysis.similarity and result.maps["legrad"].map.shape == (4, 4)


def test_prompt_targets_are_refused_where_there_is_no_text_tower(tiny_checkpoint):
    model = load_model(str(tiny_checkpoint))
    with pytest.raises(VitExplorerError, match="no text tower"):
        run(model, photo(), Request(target=Target(Prompts(("a dog",)))))
    with pytest.raises(VitExplorerError, match="needs a prompt"):
        Prompts(("  ", ""))
    assert Target.parse("text:a dog| a cat ").value == Prompts(("a dog", "a cat"))


def test_open_clip_spec_loads_a_registered_architecture_with_its_own_tokenizer():
    """``open_clip:ARCH@random``: OpenCLIP's own config and BPE tokenizer (shipped inside open_clip, no network)."""
    loaded = load_model("open_clip:ViT-B-32@random", device="cpu")
    assert loaded.map_shape == (12, 12) and loaded.layout.grid_hw == (7, 7) and loaded.preprocess.input_hw == (224, 224)
    assert loaded.random_weights and not any("byte" in note for note in loaded.notes)  # its real tokenizer
    embeddings = loaded.text.embed(["a photo of a dog", "a photo of a cat"])
    assert embeddings.shape == (2, 512) and not torch.allclose(embeddings[0], embeddings[1])
    with pytest.raises(VitExplorerError, match="no architecture"):
        load_model("open_clip:ViT-Nope@random")


def test_hf_folder_of_a_clip_config_loads_both_towers(tmp_path):
    config = transformers.CLIPConfig(vision_config=VISION, text_config=TEXT, projection_dim=16)
    config.save_pretrained(tmp_path)
    loaded = load_model(f"hf:{tmp_path}@random", device="cpu")
    assert type(loaded.module).__name__ == "CLIPVisionModelWithProjection" and loaded.num_classes == 0
    assert loaded.text is not None and loaded.text.logit_bias == 0.0
    result = run(loaded, photo((40, 40)), Request(method="legrad", target=Target(Prompts(("a dog", "a cat")))))
    assert result.analysis.labels == ["a dog", "a cat"] and np.isfinite(result.maps["legrad"].map.numpy()).all()


def test_capture_leaves_the_library_fused_path_behind(family):
    """After a capture, the towers run their own fused attention again: no explicit forward left on any module, no hook
    left beside the library's own (transformers keeps hooks of its own), the attention implementation restored."""
    _, loaded, _ = family

    def hooks() -> int:
        return sum(len(part._forward_hooks) + len(part._forward_pre_hooks) for part in loaded.module.modules())

    implementation = getattr(getattr(loaded.module, "config", None), "_attn_implementation", None)
    prompted = prompt_model(loaded, Prompts(PROMPTS))
    analyze(prompted, photo((40, 40)))  # transformers adds hooks of its own on the first pass that records attention
    before = hooks()
    analysis = analyze(prompted, photo((40, 40), seed=1))
    class_evidence(prompted, analysis, 0, ("attnlrp",))
    assert not any("forward" in vars(part) for part in loaded.module.modules())
    assert hooks() == before
    assert getattr(getattr(loaded.module, "config", None), "_attn_implementation", None) == implementation


def test_explain_takes_a_sentence_or_a_list_of_prompts():
    """``explain(image, clip_model, target="...")`` explains one prompt; a list of prompts gives the zero-shot prediction
    over them and explains the best match; ``decompose`` splits that prompt's logit."""
    from vit_explorer import explain
    from vit_explorer.explain import decompose

    loaded, own_logits = tiny_open_clip()
    one = explain(photo((40, 40)), loaded, "legrad", target="a red star")
    assert one.target == "a red star" and one.probability == pytest.approx(1.0) and one.map.shape == (4, 4)
    several = explain(photo((40, 40)), loaded, "attnlrp", target=["a red star", "a blue circle"])
    expected = own_logits(pixels_of(loaded, several.analysis), ("a red star", "a blue circle"))[0].detach()
    best = int(expected.argmax())
    assert several.target == ("a red star", "a blue circle")[best]
    assert several.probability == pytest.approx(float(expected.softmax(-1)[best]), abs=1e-4)
    parts = decompose(photo((40, 40)), loaded, target=["a blue circle", "a red star"])
    assert parts.score == pytest.approx(float(expected.max()), abs=1e-4) and parts.total == pytest.approx(parts.score, abs=1e-4)


def test_text_embeddings_are_computed_once_per_prompt_until_the_weights_change():
    """A redraw, a target change or Compare asks for the same prompts again: the text tower runs for new prompts only,
    and again after its weights change in place."""
    loaded, _ = tiny_open_clip()
    passes = []
    handle = loaded.text.module.transformer.register_forward_pre_hook(lambda _module, inputs: passes.append(inputs[0].shape[0]))
    first = loaded.text.embed(["a red star", "a cat"])
    again = loaded.text.embed(["a cat", "a red star", "a dog"])
    assert passes == [2, 1]  # only "a dog" was new
    torch.testing.assert_close(again[:2], first.flip(0))
    with torch.no_grad():
        loaded.text.module.token_embedding.weight.mul_(2.0)
    changed = loaded.text.embed(["a cat"])
    handle.remove()
    assert passes == [2, 1, 1] and not torch.allclose(changed[0], first[1])


def test_a_tokenizers_reading_names_unknown_words_and_the_text_past_its_length(tmp_path):
    """``tokenizer_reading`` on a Hugging Face tokenizer with an unknown token (a word-piece vocabulary written here):
    a word with no piece is unknown, and tokens past the text length are returned as text, never dropped silently."""
    transformers = pytest.importorskip("transformers")
    from vit_explorer.models.text import byte_reading, tokenizer_reading

    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "red", "star", "on", "the", "left"]))
    tokenizer = transformers.BertTokenizer(str(tmp_path / "vocab.txt"))
    read = tokenizer_reading(tokenizer, length=6)  # [CLS] and five tokens; the specials are not words
    reading = read("a red zebra on the left")
    assert reading.unknown == ("zebra",) and reading.tokens == ("a", "red", "[UNK]", "on", "the") and reading.cut == "left"
    assert read("a red star").cut == "" and read("a red star").unknown == ()
    assert byte_reading(8, start=1, end=2)("abcdefgh").cut == "gh"  # 8 ids less the start and end: six bytes read
