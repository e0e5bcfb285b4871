"""The LeGrad oracle for CLIP: the authors' package (``legrad-torch``, ``LeWrapper.compute_legrad_clip``) on an OpenCLIP
model, run as a script in a process of its own.

``legrad-torch`` pins ``open_clip_torch<=2.23`` (its hooks assume OpenCLIP's old sequence-first blocks), while the tool
runs the current OpenCLIP. Both are installed without dependencies into a folder of the test cache (``ensure``) and put
first on ``PYTHONPATH`` for this script only; torch, timm and the rest come from the test environment.

usage: python legrad_reference.py IN.pt OUT.pt — IN holds the CLIP config, the state dict, the image ``[1, 3, H, W]`` and
the unit text embeddings ``[p, dim]``; OUT gets the authors' maps ``[1, p, H, W]``.
"""

import os
import subprocess
import sys
from pathlib import Path

PACKAGES = ("open_clip_torch==2.23.0", "legrad-torch==1.1")
FOLDER = "legrad-reference-v1"  # bump when PACKAGES change


def ensure(cache: Path) -> Path:
    """The folder holding the two pinned packages, installed into it on first use (from the package index)."""
    folder = cache / FOLDER
    if not (folder / "legrad" / "wrapper.py").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder), *PACKAGES],
                       check=True)
    return folder


def run(cache: Path, inputs: Path, out: Path) -> None:
    folder = ensure(cache)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-W", "ignore", __file__, str(inputs), str(out)], check=True, env=environment)


def main(inputs: str, out: str) -> None:
    import open_clip
    import torch
    from legrad import LeWrapper
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    assert Path(open_clip.__file__).parent.parent.name == FOLDER, open_clip.__file__  # the pinned, old OpenCLIP
    given = torch.load(inputs, weights_only=False)
    config = given["config"]
    model = CLIP(embed_dim=config["embed_dim"], vision_cfg=CLIPVisionCfg(**config["vision"]),
                 text_cfg=CLIPTextCfg(**config["text"]))
    model.load_state_dict(given["state"], strict=True)
    model.eval()
    wrapped = LeWrapper(model, layer_index=given["layer_index"])
    maps = wrapped.compute_legrad_clip(text_embedding=given["texts"], image=given["image"])
    torch.save(maps.detach(), out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
