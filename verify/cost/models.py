"""The two published DeepSeek-V4 models, as the cost figures need them, and a user's config.json.

The fields are those of the models' published ``config.json`` files (deepseek-ai/DeepSeek-V4-Flash
and deepseek-ai/DeepSeek-V4-Pro on Hugging Face, as issue #23 quotes them): V4-Flash 43 layers =
21 C4A + 20 C128A + 2 SWA-only, index top-k 512; V4-Pro 61 layers = 30 C4A + 31 C128A, index
top-k 1024; both 64 index heads x 128 dims, a 128-token window and 448 + 64 latent dims (a 584-B
FlashMLA row). Upstream's ``DeepSeekV4Config`` (``srt/configs/deepseek_v4.py``) defaults to
V4-Flash's shape, which tests/test_cost.py holds these to; nothing in the wheel states V4-Pro's.
The activated parameters (13B, 49B) are the model cards'. Only the number of layers per ratio
enters upstream's pool configurator (``collect_sources_by_ratio``), so the order of the ratios
below is this module's, not the checkpoints'.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    name: str
    compress_ratios: tuple[int, ...]  # one per layer: 0 = SWA only, 4 = C4A (indexer), 128 = C128A
    index_topk: int
    index_n_heads: int
    index_head_dim: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    num_attention_heads: int
    window_size: int
    activated_params: float
    source: str

    def layers(self, ratio: int) -> int:
        return sum(1 for r in self.compress_ratios if r == ratio)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.__dict__,
            "compress_ratios": list(self.compress_ratios),
            "layers": {str(r): self.layers(r) for r in (0, 4, 128)},
        }


FLASH = ModelShape(
    name="DeepSeek-V4-Flash",
    compress_ratios=(0, 0) + (4, 128) * 20 + (4,),
    index_topk=512,
    index_n_heads=64,
    index_head_dim=128,
    qk_nope_head_dim=448,
    qk_rope_head_dim=64,
    v_head_dim=512,
    num_attention_heads=64,
    window_size=128,
    activated_params=13e9,
    source="deepseek-ai/DeepSeek-V4-Flash config.json (284B total, 13B activated: model card)",
)
PRO = ModelShape(
    name="DeepSeek-V4-Pro",
    compress_ratios=(128, 128) + (4, 128) * 29 + (4,),
    index_topk=1024,
    index_n_heads=64,
    index_head_dim=128,
    qk_nope_head_dim=448,
    qk_rope_head_dim=64,
    v_head_dim=512,
    num_attention_heads=128,
    window_size=128,
    activated_params=49e9,
    source="deepseek-ai/DeepSeek-V4-Pro config.json (1.6T total, 49B activated: model card)",
)
MODELS = {"flash": FLASH, "pro": PRO}
#: per-GPU weight memory the default budget assumes: the checkpoints' download sizes (~160 GB,
#: ~865 GB) over a tensor-parallel degree of H200s: Flash on 4; Pro on 16 (two nodes), since on 8
#: its 108 GB per GPU leave less than the cap-mode SWA pool of 256 requests needs
TP = {FLASH.name: 4, PRO.name: 16}
WEIGHTS_GIB = {FLASH.name: 160e9 / TP[FLASH.name] / 2**30, PRO.name: 865e9 / TP[PRO.name] / 2**30}


def from_config(path: Path, activated_params: float) -> ModelShape:
    """A ``config.json`` of the DeepSeek-V4 family; missing fields take upstream's
    ``DeepSeekV4Config`` defaults (its dataclass fields), as upstream's loader does."""
    from sglang.srt.configs.deepseek_v4 import DeepSeekV4Config

    raw = json.loads(path.read_text())
    defaults = {
        f.name: f.default for f in DeepSeekV4Config.__dataclass_fields__.values() if f.default is not MISSING
    }

    def get(key: str) -> Any:
        return raw.get(key, defaults.get(key))

    layers = int(get("num_hidden_layers"))
    ratios = tuple(
        int(r) for r in (get("compress_ratios") or ())[:layers]
    )  # a trailing MTP entry is not a layer
    if len(ratios) != layers:
        raise ValueError(f"{path}: compress_ratios has {len(ratios)} entries for {layers} layers")
    shape = replace(
        FLASH,
        name=str(raw.get("_name_or_path") or path.parent.name or path.name),
        compress_ratios=ratios,
        index_topk=int(get("index_topk")),
        index_n_heads=int(get("index_n_heads")),
        index_head_dim=int(get("index_head_dim")),
        qk_nope_head_dim=int(get("qk_nope_head_dim")),
        qk_rope_head_dim=int(get("qk_rope_head_dim")),
        v_head_dim=int(get("v_head_dim")),
        num_attention_heads=int(get("num_attention_heads")),
        window_size=int(raw.get("window_size", raw.get("sliding_window", defaults.get("window_size")))),
        activated_params=activated_params,
        source=f"{path} (activated parameters given on the command line)",
    )
    return shape
