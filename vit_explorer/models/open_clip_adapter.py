"""Adapter for OpenCLIP's ViT image towers (``open_clip.transformer.VisionTransformer``), with their text tower.

OpenCLIP's blocks compute attention in ``nn.MultiheadAttention``, whose fused kernel no hook can see. While capturing,
the adapter gives each block's attention module an explicit forward with the same weights (q·kᵀ/√dim_head, a softmax
module that the hooks see, the values, the out-projection) and takes it away afterwards. The image embedding is the
model's own: the class token (or the patch mean) after ``ln_post``, through ``proj``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from vit_explorer.errors import VitExplorerError
from vit_explorer.models.base import ELEMENTWISE, HookAdapter, LoadedModel, Preprocess, insert_zero_token
from vit_explorer.models.hub import load_cached_or_fetch
from vit_explorer.models.layout import TokenLayout, check_input_hw
from vit_explorer.models.text import RANDOM_TOKENIZER, Reading, TextTower, byte_reading, byte_tokens, tokenizer_reading

RANDOM = "random"  # ``open_clip:ARCH@random``: the architecture with freshly initialised weights


def require_open_clip():
    try:
        import open_clip
    except ImportError:
        raise VitExplorerError("OpenCLIP models need open-clip-torch: pip install 'vit-explorer[clip]'") from None
    return open_clip


def projected(attention: nn.MultiheadAttention, query: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``attention``'s queries, keys and values of batch-first ``query`` ``[b, n, dim]``, each ``[b, heads, n, head_dim]``."""
    if key is not query or value is not query:
        raise VitExplorerError("this OpenCLIP block attends to another sequence; vit_explorer captures self-attention only")
    q, k, v = F.linear(query, attention.in_proj_weight, attention.in_proj_bias).chunk(3, dim=-1)
    return tuple(rearrange(part, "b n (h d) -> b h n d", h=attention.num_heads) for part in (q, k, v))


def explicit_attention(attention: nn.MultiheadAttention, softmax: nn.Module, query: torch.Tensor, key: torch.Tensor,
                       value: torch.Tensor, need_weights: bool = False, attn_mask: torch.Tensor | None = None,
                       **_options) -> tuple[torch.Tensor, None]:
    """``attention``'s self-attention of batch-first ``query`` ``[b, n, dim]`` written out, its post-softmax map the output
    of ``softmax`` ``[b, heads, n, n]``; returns the out-projection's output ``[b, n, dim]`` as ``nn.MultiheadAttention``
    does (the map is not returned: capture reads it at ``softmax``)."""
    q, k, v = projected(attention, query, key, value)
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # [b, heads, n, n]
    if attn_mask is not None:
        scores = scores + attn_mask
    weights = F.dropout(softmax(scores), attention.dropout, attention.training)
    return attention.out_proj(rearrange(weights @ v, "b h n d -> b n (h d)")), None


def fused_attention(attention: nn.MultiheadAttention, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    need_weights: bool = False, attn_mask: torch.Tensor | None = None, **_options) -> tuple[torch.Tensor, None]:
    """``attention``'s self-attention as ``nn.MultiheadAttention`` computes it without weights (in-projection, one
    ``scaled_dot_product_attention``, out-projection), with the SDPA call made here, where a torch function mode sees it
    (inside ``F.multi_head_attention_forward`` none does)."""
    q, k, v = projected(attention, query, key, value)
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                           dropout_p=attention.dropout if attention.training else 0.0)
    return attention.out_proj(rearrange(heads, "b h n d -> b n (h d)")), None


# one softmax module per attention module, made on first use: what the capture hooks
_softmaxes: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()


def softmax_of(attention: nn.Module) -> nn.Module:
    if attention not in _softmaxes:
        _softmaxes[attention] = nn.Softmax(dim=-1)
    return _softmaxes[attention]


class OpenClipAdapter(HookAdapter):
    """Explicit attention through a hooked softmax while capturing; the class token after ``ln_post`` through ``proj``."""

    @classmethod
    def matches(cls, module: nn.Module) -> bool:
        if not type(module).__module__.startswith("open_clip.") or type(module).__name__ != "VisionTransformer":
            return False
        blocks = list(module.transformer.resblocks)
        return bool(blocks) and all(isinstance(getattr(block, "attn", None), nn.MultiheadAttention) for block in blocks)

    def blocks(self, module: nn.Module) -> list[nn.Module]:
        return list(module.transformer.resblocks)

    def softmax_modules(self, module: nn.Module) -> list[nn.Module]:
        return [softmax_of(block.attn) for block in self.blocks(module)]

    reads_attention_inputs = True  # ``fused`` calls SDPA once per block

    @contextmanager
    def forward_of_attention(self, module: nn.Module, forward: Callable[[nn.Module], Callable]) -> Iterator[None]:
        """Every block's attention runs ``forward(attention)`` while active."""
        attentions = [block.attn for block in self.blocks(module)]
        try:
            for attention in attentions:
                # an instance attribute shadows the class's forward for this module only
                attention.forward = forward(attention)
            yield
        finally:
            for attention in attentions:
                attention.__dict__.pop("forward", None)

    def unfused(self, module: nn.Module) -> AbstractContextManager[None]:
        return self.forward_of_attention(module, lambda attention: partial(explicit_attention, attention, softmax_of(attention)))

    def fused(self, module: nn.Module) -> AbstractContextManager[None]:
        return self.forward_of_attention(module, lambda attention: partial(fused_attention, attention))

    def map_shape(self, module: nn.Module) -> tuple[int, int]:
        blocks = self.blocks(module)
        return len(blocks), blocks[0].attn.num_heads

    def num_classes(self, module: nn.Module) -> int:
        return 0  # an image tower: its classes are prompts (``targets.prompt_model``)

    def logits(self, module: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
        module(pixels)
        return pixels.new_zeros(pixels.shape[0], 0)

    def classify(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.new_zeros(hidden.shape[0], 0)

    def final_tokens(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return module.ln_post(hidden)

    def project(self, module: nn.Module, pooled: torch.Tensor) -> torch.Tensor:
        return pooled if module.proj is None else pooled @ module.proj

    def pool(self, module: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        pooled = tokens[:, 1:].mean(dim=1) if module.pool_type == "avg" else tokens[:, 0]
        return self.project(module, pooled)

    def layer_embedding(self, module: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        # LeGrad's authors read CLIP's layers through the mean of all tokens, then ln_post and proj
        # (WalBouss/LeGrad, ``compute_legrad_clip``)
        return self.project(module, module.ln_post(hidden.mean(dim=1)))

    def attention_writes(self, module: nn.Module) -> list[nn.Module]:
        return [block.ls_1 for block in self.blocks(module)]

    def head_projections(self, module: nn.Module) -> list[nn.Module]:
        return [block.attn.out_proj for block in self.blocks(module)]

    def activations(self, module: nn.Module) -> list[nn.Module]:
        # OpenCLIP's QuickGELU is a module of its own
        return [part for part in module.modules() if isinstance(part, ELEMENTWISE) or type(part).__name__ == "QuickGELU"]

    def mlp_activations(self, module: nn.Module) -> list[nn.Module]:
        return [block.mlp.gelu for block in self.blocks(module)]  # c_fc, gelu, (ln), c_proj

    def add_prefix_token(self, module: nn.Module, at: int) -> None:
        if module.pool_type != "tok":
            raise VitExplorerError(f"this OpenCLIP tower pools by {module.pool_type!r}, which would take a test-time register "
                                   "in: only a class-token tower can have one")
        # ``_embeds``: class token, position embedding, ``patch_dropout``, ``ln_pre``: the token goes in before ``ln_pre``,
        # where Jiang et al. put it in their OpenCLIP
        module.patch_dropout.register_forward_hook(partial(insert_zero_token, at))

    def layout(self, module: nn.Module, input_hw: tuple[int, int]) -> TokenLayout:
        patch_hw = tuple(module.patch_size)
        check_input_hw(input_hw, patch_hw)
        if tuple(input_hw) != tuple(module.image_size):
            height, width = module.image_size
            raise VitExplorerError(f"this OpenCLIP model has position embeddings for {height}×{width} inputs; it cannot take "
                                   f"{input_hw[0]}×{input_hw[1]}")
        return TokenLayout(prefix_names=("cls",), grid_hw=tuple(module.grid_size), patch_hw=patch_hw)


def unsupported(visual: nn.Module) -> str | None:
    """Why vit_explorer cannot explain this OpenCLIP image tower, or None."""
    if not OpenClipAdapter.matches(visual):
        return f"its image tower is a {type(visual).__name__}, not a ViT of nn.MultiheadAttention blocks"
    if getattr(visual, "attn_pool", None) is not None:
        return "its image tower pools through attention (CoCa)"
    if getattr(visual, "final_ln_after_pool", False) or not visual.transformer.batch_first:
        return "its image tower normalises after pooling or runs sequence-first"
    if visual.pool_type not in ("tok", "avg"):
        return f"its image tower pools by {visual.pool_type!r}"
    return None


def open_clip_reading(tokenizer, context: int) -> Callable[[str], Reading]:
    """What an OpenCLIP tokenizer reads of a prompt in ``context`` tokens: a Hugging Face one's reading, or for its own
    byte-level BPE (every text has tokens, so no word is unknown) the tokens between its start and end token."""
    if hasattr(tokenizer, "tokenizer"):  # open_clip.tokenizer.HFTokenizer
        return tokenizer_reading(tokenizer.tokenizer, context)

    def read(prompt: str) -> Reading:
        ids = tokenizer.encode(prompt)
        room = context - 2
        return Reading(tokens=tuple(tokenizer.decoder[index] for index in ids[:room]),
                       cut=tokenizer.decode(ids[room:]).strip() if ids[room:] else "")

    return read


def from_open_clip(model: nn.Module, name: str, tokenizer=None, random_weights: bool = False) -> LoadedModel:
    """A ``LoadedModel`` of an OpenCLIP model's image tower, with its text tower as ``text``: prompts through
    ``tokenizer`` (None: byte tokens, for a random model only) and ``encode_text``, scored by the model's logit scale
    (and SigLIP's logit bias)."""
    open_clip = require_open_clip()
    visual = getattr(model, "visual", None)
    why = "it has no image tower" if visual is None else unsupported(visual)
    if why is not None:
        raise VitExplorerError(f"{name}: vit_explorer cannot capture this OpenCLIP model: {why}")
    model.eval()
    config = open_clip.get_model_preprocess_cfg(model)
    size = config.get("size", visual.image_size)
    size = (size, size) if isinstance(size, int) else tuple(size)
    preprocess = Preprocess(input_hw=size, mean=tuple(config.get("mean", open_clip.OPENAI_DATASET_MEAN)),
                            std=tuple(config.get("std", open_clip.OPENAI_DATASET_STD)),
                            interpolation=config.get("interpolation", "bicubic"))
    notes = []
    context = int(getattr(model, "context_length", 77))
    if tokenizer is None:
        if not random_weights:
            raise VitExplorerError(f"{name}: a trained text tower needs its own tokenizer")
        vocab = int(getattr(model, "vocab_size", 49408))

        def tokenizer(prompts: list[str]) -> torch.Tensor:
            return byte_tokens(prompts, context, vocab, start=None, end=vocab - 1)

        read = byte_reading(context, None, vocab - 1)
        notes.append(RANDOM_TOKENIZER)
    else:
        read = open_clip_reading(tokenizer, context)
    bias = getattr(model, "logit_bias", None)

    def encode(prompts: list[str]) -> torch.Tensor:
        return model.encode_text(tokenizer(prompts).to(next(model.parameters()).device))

    text = TextTower(encode=encode, read=read, logit_scale=float(model.logit_scale.detach().exp()),
                     logit_bias=0.0 if bias is None else float(bias.detach()), notes=tuple(notes), module=model)
    adapter = OpenClipAdapter()
    return LoadedModel(module=visual, name=name, preprocess=preprocess, layout=adapter.layout(visual, preprocess.input_hw),
                       adapter=adapter, notes=notes, random_weights=random_weights, text=text)


def load_open_clip(spec: str) -> LoadedModel:
    """``ARCH@random`` (the architecture, random weights), ``ARCH@FILE`` (weights in a local file), ``ARCH@TAG`` (a
    pretrained tag, from the local cache or the hub) or ``hf-hub:ORG/REPO``."""
    open_clip = require_open_clip()
    arch, _, weights = spec.partition("@")
    name = f"open_clip:{spec}"
    random_weights = weights == RANDOM
    known = arch.startswith("hf-hub:") or arch in open_clip.list_models()
    if not known:
        raise VitExplorerError(f"{name}: OpenCLIP has no architecture {arch!r}; open_clip.list_models() names them "
                               "(e.g. ViT-B-32, ViT-B-16)")
    local = Path(weights).expanduser() if weights and not random_weights else None
    if local is not None and not local.exists() and ("/" in weights or local.suffix):
        raise VitExplorerError(f"{name}: no weights file at {local}")

    def build() -> LoadedModel:
        pretrained = None if random_weights else (str(local) if local is not None and local.exists() else weights or None)
        try:
            model = open_clip.create_model(arch, pretrained=pretrained, require_pretrained=not random_weights)
        except RuntimeError as error:
            raise VitExplorerError(f"{name}: the weights do not fit {arch}: {' '.join(str(error).split())[:400]}") from None
        try:
            tokenizer = open_clip.get_tokenizer(arch)
        except (OSError, ValueError):  # a tokenizer on the hub, unreachable: a random model can do without it
            if not random_weights:
                raise
            tokenizer = None
        return from_open_clip(model, name, tokenizer, random_weights)

    if random_weights or local is not None and local.exists():
        return build()
    return load_cached_or_fetch(build, name, f"Without network, give the weights as a file: open_clip:{arch}@/path/to/weights")
