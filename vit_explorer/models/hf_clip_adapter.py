"""Adapter for the image towers of Hugging Face ``CLIPModel`` and ``SiglipModel``, with their text towers.

The image tower is what is captured: CLIP's vision transformer with its projection (a class token, read after
``post_layernorm`` through ``visual_projection``), or SigLIP's (no class token; the attention-pooling head reads every
token after ``post_layernorm``). Attention is captured as for the other transformers models (``HFAdapter``). The text
tower scores prompts the way the model does: CLIP by ``logit_scale`` × cosine, SigLIP by the same plus ``logit_bias``.

SigLIP's pooling head attends with a fused ``nn.MultiheadAttention`` that is not one of the layers: its map is not
captured, AttnLRP differentiates it as it is (so its relevance is not exactly conserved), and the decomposition, whose
read-out must be affine in the stream, refuses it and says why.
"""

from __future__ import annotations

import torch
from torch import nn

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import LoadedModel
from vit_explorer.models.hf_adapter import HFAdapter, from_hf_module, require_transformers
from vit_explorer.models.layout import TokenLayout, check_input_hw
from vit_explorer.models.text import RANDOM_TOKENIZER, TextTower, byte_reading, byte_tokens, tokenizer_reading

TOWER_TYPES = {"clip_vision_model", "siglip_vision_model"}  # the image towers' own config types
FULL_TYPES = {"clip", "siglip"}  # the models with both towers, which ``from_hf_clip`` takes apart


class HFTowerAdapter(HFAdapter):
    """A CLIP or SigLIP image tower: no classes (prompts become them), its embedding in the space shared with text."""

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        config = getattr(module, "config", None)
        return type(module).__module__.startswith("transformers.") and getattr(config, "model_type", None) in TOWER_TYPES

    @staticmethod
    def pools_class_token(module: nn.Module) -> bool:
        return module.config.model_type == "clip_vision_model"

    def num_classes(self, module: nn.Module) -> int:
        return 0

    def classify(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.new_zeros(hidden.shape[0], 0)

    def final_tokens(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return module.base_model.post_layernorm(hidden)

    def pool(self, module: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        if self.pools_class_token(module):
            projection = getattr(module, "visual_projection", None)
            return tokens[:, 0] if projection is None else projection(tokens[:, 0])
        return module.base_model.head(tokens)

    def layer_embedding(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        if not self.pools_class_token(module):
            return super().layer_embedding(module, hidden)
        # LeGrad's authors read CLIP's layers through the mean of all tokens (WalBouss/LeGrad, ``compute_legrad_clip``)
        return self.pool(module, module.base_model.post_layernorm(hidden.mean(dim=1, keepdim=True)))

    def blocks(self, module: nn.Module) -> list[nn.Module]:
        return list(module.base_model.encoder.layers)

    def attention_writes(self, module: nn.Module) -> list[nn.Module]:
        return [block.self_attn for block in self.blocks(module)]

    def head_projections(self, module: nn.Module) -> list[nn.Module]:
        return [attention.out_proj for attention in self.attention_modules(module)]

    def layout(self, module: nn.Module, input_hw: tuple[int, int]) -> TokenLayout:
        patch = module.config.patch_size
        check_input_hw(input_hw, (patch, patch))
        names = ("cls",) if self.pools_class_token(module) else ()
        return TokenLayout(prefix_names=names, grid_hw=(input_hw[0] // patch, input_hw[1] // patch), patch_hw=(patch, patch))


def image_tower(full: nn.Module) -> nn.Module:
    """The image tower of a ``CLIPModel`` (its vision model with ``visual_projection``, sharing their weights) or a
    ``SiglipModel`` (its vision model, whose head pools)."""
    transformers = require_transformers()
    if full.config.model_type == "siglip":
        if not getattr(full.vision_model, "use_head", False):
            raise VitExplorerError("this SigLIP model's image tower has no pooling head, so it has no image embedding to score")
        return full.vision_model
    config = full.vision_model.config
    config.projection_dim = full.config.projection_dim
    with torch.device("meta"):  # built without memory: its two parts are the full model's own
        tower = transformers.CLIPVisionModelWithProjection(config)
    tower.vision_model, tower.visual_projection = full.vision_model, full.visual_projection
    return tower


def text_tower(full: nn.Module, tokenizer, random_weights: bool) -> TextTower:
    """The text tower of ``full``: prompts through ``tokenizer`` (None: byte tokens, for random weights only)."""
    siglip = full.config.model_type == "siglip"
    text_config = full.config.text_config
    notes: tuple[str, ...] = ()
    if tokenizer is None:
        if not random_weights:
            raise VitExplorerError("this model's folder has no tokenizer files: save the tokenizer with the model "
                                   "(processor.save_pretrained(folder))")
        length = int(getattr(text_config, "max_position_embeddings", 64))
        start = None if siglip else text_config.bos_token_id
        end = None if siglip else text_config.eos_token_id

        def tokenize(prompts: list[str]) -> dict[str, torch.Tensor]:
            ids = byte_tokens(prompts, length, text_config.vocab_size, start, end, pad=text_config.pad_token_id or 0)
            return {"input_ids": ids}

        read = byte_reading(length, start, end)
        notes = (RANDOM_TOKENIZER,)
    else:
        read = tokenizer_reading(tokenizer,
                                 64 if siglip else min(tokenizer.model_max_length, text_config.max_position_embeddings))

        def tokenize(prompts: list[str]) -> dict[str, torch.Tensor]:
            # SigLIP was trained on text padded to its full length; CLIP pools its end token
            options = {"padding": "max_length", "max_length": 64} if siglip else {"padding": True}
            tokens = tokenizer(prompts, truncation=True, return_tensors="pt", **options)
            return {key: value for key, value in tokens.items() if key in ("input_ids", "attention_mask")}

    def encode(prompts: list[str]) -> torch.Tensor:
        device = next(full.parameters()).device
        return full.get_text_features(**{key: value.to(device) for key, value in tokenize(prompts).items()}).pooler_output

    bias = getattr(full, "logit_bias", None)
    return TextTower(encode=encode, read=read, logit_scale=float(full.logit_scale.detach().exp()),
                     logit_bias=0.0 if bias is None else float(bias.detach()), notes=notes, module=full)


def from_hf_clip(full: nn.Module, name: str, source: str | None = None, input_hw: tuple[int, int] | None = None,
                 random_weights: bool = False) -> LoadedModel:
    """A ``LoadedModel`` of a ``CLIPModel``'s or ``SiglipModel``'s image tower, with its text tower as ``text`` (the
    tokenizer from ``source``, a folder or hub name; byte tokens for random weights without one)."""
    if getattr(full.config, "model_type", None) not in FULL_TYPES:
        raise VitExplorerError(f"{name}: a {type(full).__name__} is not a CLIP or SigLIP model with both towers")
    full.eval()
    tokenizer = None
    if source is not None:
        try:
            tokenizer = require_transformers().AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError, TypeError):
            tokenizer = None
    loaded = from_hf_module(image_tower(full), name, source, input_hw, adapter=HFTowerAdapter())
    loaded.text = text_tower(full, tokenizer, random_weights)
    loaded.random_weights = random_weights
    loaded.notes = [*loaded.notes, *loaded.text.notes]
    return loaded
