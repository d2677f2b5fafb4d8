"""verify.cost on the real patched upstream: the configurator it runs selects each format through
upstream's own server arguments, its token counts follow from upstream's byte accounting, the
decode bytes and prefill FLOPs match hand counts, and the committed artifact is a fresh run's."""

from __future__ import annotations

import io
import json
import logging
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from verify import figures
from verify.core import platform as P
from verify.core import upstream as U
from verify.core.provenance import SERIES_HASH, series_hash

ROOT = Path(__file__).resolve().parents[1]
ARTIFACT = ROOT / figures.COST / "cost.json"

pytestmark = pytest.mark.skipif(
    U.sglang_root() is None, reason="the patched upstream tree is not importable (nox -s apply)"
)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str]:
    from verify.cost.cli import main

    out = tmp_path_factory.mktemp("cost") / "cost.json"
    printed = io.StringIO()
    with redirect_stdout(printed):
        assert main(["--out", str(out)]) == 0
    # Quieting the configurator must not outlive the call: a later test's assertLogs relies on it.
    assert logging.root.manager.disable == logging.NOTSET
    return json.loads(out.read_text()), printed.getvalue()


def test_each_format_is_the_one_upstreams_resolver_reads() -> None:
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import resolve_dsv4_index_k_format

    from verify.cost.capacity import FORMATS, Serving, upstream_args

    for fmt in FORMATS:
        for mode in ("ratio", "cap"):
            with upstream_args(fmt, mode, Serving()):
                assert resolve_dsv4_index_k_format() == fmt


def test_the_overrides_are_what_server_arg_resolution_gives_each_format() -> None:
    import argparse

    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.arg_groups.serving_hook import handle_deepseek_v4_indexer_k_dtype
    from sglang.srt.runtime_context import override_platform
    from sglang.srt.server_args import ServerArgs

    from verify.cost.capacity import FORMATS, format_overrides

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    for fmt in FORMATS:
        args = ServerArgs.from_cli_args(
            parser.parse_args(["--model-path", "m", "--deepseek-v4-indexer-k-dtype", fmt])
        )
        with override_platform(is_cuda=True, is_hip=False, is_sm100=True):
            handle_deepseek_v4_indexer_k_dtype(args)
        view = resolving_view(args)
        assert {name: getattr(view, name) for name in format_overrides(fmt)} == format_overrides(fmt)
    with pytest.raises(ValueError):
        format_overrides("int8")


def test_pool_tokens_follow_upstreams_byte_accounting(fresh: tuple[dict, str]) -> None:
    """bf16 adds (256 - 132) / 4 B per full token per C4A layer to the configurator's coefficient;
    fp4 adds nothing on NVIDIA (budgeted at 132 B, though its pool allocates 68); the full pool is
    (budget - fixed bytes) / coefficient, page-aligned."""
    import torch
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4IndexerPool

    data, _ = fresh
    pool = DeepSeekV4IndexerPool(
        size=64,
        page_size=64,
        dtype=torch.bfloat16,
        index_head_dim=128,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
        use_fp4_indexer=True,
        index_k_format="fp4",
    )
    assert pool.get_bytes_per_token() == 68
    for m in data["models"]:
        c4 = m["shape"]["layers"]["4"]
        budget = m["serving"]["budget_bytes"]
        for mode in ("ratio", "cap"):
            cap = {c["fmt"]: c for c in m["capacity"] if c["mode"] == mode}
            assert (
                cap["bf16"]["bytes_per_full_token"] - cap["fp8"]["bytes_per_full_token"]
                == c4 * (256 - 132) / 4
            )
            assert cap["fp4"]["index_bytes_budgeted"] == 132 and cap["fp4"]["index_bytes_allocated"] == 68
            assert cap["fp4"]["full_tokens"] == cap["fp8"]["full_tokens"]
            for c in cap.values():
                assert (
                    c["full_tokens"]
                    == int((budget - c["fixed_bytes"]) / c["bytes_per_full_token"]) // 256 * 256
                )
                assert (c["swa_cap_tokens"] is None) == (mode == "ratio")


def test_decode_bytes_and_prefill_flops_match_hand_counts() -> None:
    from verify.cost.models import FLASH
    from verify.cost.traffic import decode_bytes, prefill_flops

    # V4-Flash at 32K: 43 windows of 128 rows, 21 x 512 selected rows, 20 x 256 C128 rows (584 B
    # each), 21 x 8192 fp8 index keys of 132 B
    fp8 = decode_bytes(FLASH, 32768, 584, 132)
    assert fp8.total == 43 * 128 * 584 + 21 * 512 * 584 + 20 * 256 * 584 + 21 * 8192 * 132 == 35_191_808
    assert round(fp8.indexer_share, 3) == 0.645
    assert decode_bytes(FLASH, 32768, 584, 256).total - fp8.total == 21 * 8192 * (256 - 132)
    n = 1 << 20
    q = n // 4
    floor_sum = 4 * q * (q - 1) // 2 + q * (n - 4 * q + 1)  # sum of t // 4 for t = 1..n
    assert prefill_flops(FLASH, n).indexer == 21 * (2 * 64 * 128 + 2 * 64) * floor_sum
    assert prefill_flops(FLASH, n).dense == 2 * 13e9 * n


def test_the_published_shapes_and_a_users_config(tmp_path: Path) -> None:
    from sglang.srt.configs.deepseek_v4 import DeepSeekV4Config

    from verify.cost.models import FLASH, PRO, from_config

    defaults = {f.name: f.default for f in DeepSeekV4Config.__dataclass_fields__.values()}
    for field in (
        "index_topk",
        "index_n_heads",
        "index_head_dim",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "window_size",
        "num_attention_heads",
        "v_head_dim",
    ):
        assert getattr(FLASH, field) == defaults[field], field
    assert len(FLASH.compress_ratios) == defaults["num_hidden_layers"] == 43
    assert (FLASH.layers(4), FLASH.layers(128), FLASH.layers(0)) == (21, 20, 2)
    assert (PRO.layers(4), PRO.layers(128), PRO.layers(0), PRO.index_topk) == (30, 31, 0, 1024)
    config = dict(
        P.STAND_IN_CONFIG, compress_ratios=[*P.STAND_IN_CONFIG["compress_ratios"], 0]
    )  # + the MTP layer
    (tmp_path / "config.json").write_text(json.dumps(config))
    mine = from_config(tmp_path / "config.json", 13e9)
    assert mine.compress_ratios == FLASH.compress_ratios and mine.index_topk == 512


def test_the_committed_artifact_is_a_fresh_runs_and_the_printed_tables_are_its_block(
    fresh: tuple[dict, str],
) -> None:
    data, printed = fresh
    # which series made it is provenance, not a figure: the committed run may name an earlier one
    unnamed = {SERIES_HASH: None}
    assert json.loads(ARTIFACT.read_text()) | unnamed == data | unnamed, f"regenerate: {figures.COST_COMMAND}"
    assert data[SERIES_HASH] == series_hash()
    for a in data["assumptions"]:
        assert a in printed
    block = figures.cost(ROOT)
    tables = block.split("\n\n", 1)[1]
    assert tables.strip() in printed
    flash = data["models"][0]
    at_1m = flash["per_length"][-1]
    assert f"{at_1m['ttft_factor']['bf16']:.2f}x" in block and at_1m["ttft_factor"]["fp4"] is None
    assert at_1m["bench_prefill"]["at"] == "prefill 131,072 tokens"


def test_a_cost_figure_edited_by_hand_is_caught(tmp_path: Path) -> None:
    for rel in figures.DOCS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    shutil.copytree(ROOT / figures.COST, tmp_path / figures.COST, dirs_exist_ok=True)
    doc = tmp_path / figures.COST / "README.md"
    assert not [p for p in figures.check(tmp_path) if "'cost'" in p]
    doc.write_text(doc.read_text().replace("| -14.3% |", "| -13.3% |", 1))
    assert any(f"{figures.COST}/README.md: block 'cost' differs" in p for p in figures.check(tmp_path))
