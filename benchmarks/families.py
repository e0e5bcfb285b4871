"""Every timm ViT-like family, built with random weights at its smallest size and tried as a user would: does it load,
and which explanation methods give a map. Writes benchmarks/families.json and the table in docs/models.md (between the
``families table`` markers).

    python benchmarks/families.py

One model per family (its smallest timm name); each method is asked through ``explain`` on one random image, and what
it returns or the first line of the ``VitExplorerError`` it raises is recorded. Any other exception is recorded as a
crash, which the table shows and the tests (tests/test_timm_adapter.py) forbid.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import torch
from PIL import Image

from vit_explorer import VitExplorerError, explain, load_model
from vit_explorer.core.maps import CLASS_METHODS

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "families.json"
DOC = ROOT / "docs" / "models.md"
START, END = "<!-- families table: benchmarks/families.py writes it -->", "<!-- end of the families table -->"

# family → its smallest timm name (timm 1.0's names)
FAMILIES = {
    "ViT": "vit_tiny_patch16_224",
    "DeiT (distilled)": "deit_tiny_distilled_patch16_224",
    "DeiT-III": "deit3_small_patch16_224",
    "DINOv2 (registers)": "vit_small_patch14_reg4_dinov2",
    "BEiT": "beitv2_base_patch16_224",
    "EVA-02": "eva02_tiny_patch14_224",
    "RoPE ViT": "vit_small_patch16_rope_224",
    "RoPE ViT with a register, no class token (Eva)": "vit_medium_patch16_rope_reg1_gap_256",
    "relative-position ViT": "vit_relpos_small_patch16_224",
    "FlexiViT": "flexivit_small",
    "CLIP image tower": "vit_base_patch16_clip_224",
    "SigLIP image tower": "vit_base_patch16_siglip_224",
    "Swin": "swin_tiny_patch4_window7_224",
    "Swin V2": "swinv2_tiny_window8_256",
    "CaiT": "cait_xxs24_224",
    "PiT": "pit_ti_224",
    "XCiT": "xcit_tiny_12_p16_224",
    "LeViT": "levit_128s",
    "Hiera": "hiera_tiny_224",
    "MViTv2": "mvitv2_tiny",
    "PVTv2": "pvt_v2_b0",
    "Twins": "twins_svt_small",
    "CrossViT": "crossvit_tiny_240",
    "ConViT": "convit_tiny",
    "TNT": "tnt_s_patch16_224",
    "VOLO": "volo_d1_224",
    "SAM encoder": "samvit_base_patch16",
    "MaxViT": "maxvit_tiny_tf_224",
    "CoaT": "coat_lite_tiny",
    "DaViT": "davit_tiny",
    "TinyViT": "tiny_vit_5m_224",
    "FastViT": "fastvit_t8",
    "MobileViT": "mobilevit_xxs",
    "hybrid ViT (ResNet stem)": "vit_small_r26_s32_224",
    "ViTamin": "vitamin_small_224",
    "parallel-block ViT": "vit_small_patch16_18x2_224",
}
METHODS = tuple(CLASS_METHODS)


def first_sentence_part(message: str) -> str:
    """The reason of a refusal without the model's spec and the list of what the loader reads."""
    reason = message.split("; it reads")[0]
    return re.sub(r"^timm:\S+: vit_explorer cannot read ", "", reason)


def try_family(name: str) -> dict:
    torch.manual_seed(0)
    try:
        model = load_model(f"timm:{name}@random")
    except VitExplorerError as error:
        return {"name": name, "loads": False, "refusal": first_sentence_part(str(error))}
    except Exception as error:  # recorded, not hidden: the table shows it as a crash
        return {"name": name, "loads": False, "crash": f"{type(error).__name__}: {error}"}
    height, width = model.preprocess.input_hw
    image = Image.fromarray(torch.randint(0, 255, (height, width, 3), dtype=torch.uint8).numpy())
    methods = {}
    for method in METHODS:
        try:
            explanation = explain(image, model=model, method=method)
            methods[method] = "map" if tuple(explanation.map.shape) == model.layout.grid_hw else "wrong shape"
        except VitExplorerError as error:
            methods[method] = f"refused: {str(error).splitlines()[0]}"
        except Exception as error:
            methods[method] = f"crash: {type(error).__name__}: {error}"
    return {"name": name, "loads": True, "grid_hw": list(model.layout.grid_hw), "prefix": list(model.layout.prefix_names),
            "stages": model.adapter.num_stages(model.module), "methods": methods}


def table(results: dict) -> str:
    lines = ["| family | timm name tried | loads | " + " | ".join(METHODS) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in METHODS) + " |"]
    for family, result in results.items():
        if result["loads"]:
            stages = result.get("stages", 1)
            cells = ["yes, " + "×".join(map(str, result["grid_hw"])) + " grid"
                     + (f" (stage 0 of {stages}; `#stage=K` the others)" if stages > 1 else "")]
            cells += ["✓" if result["methods"][m] == "map" else result["methods"][m] for m in METHODS]
        else:
            why = result.get("refusal") or f"**crash**: {result['crash']}"
            cells = [f"refused: {why}", *("—" for _ in METHODS)]
        lines.append(f"| {family} | `{result['name']}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    warnings.filterwarnings("ignore")
    results = {}
    for family, name in FAMILIES.items():
        results[family] = try_family(name)
        print(family, json.dumps(results[family])[:160], flush=True)
    OUT.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    text = DOC.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    DOC.write_text(f"{head}{START}\n{table(results)}\n{END}{tail}")


if __name__ == "__main__":
    main()
