"""Every figure block in README.md and the results READMEs is what its committed artifact says."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from verify import figures

ROOT = Path(__file__).resolve().parents[1]


def test_every_figures_block_matches_its_artifact() -> None:
    problems = figures.check()
    assert not problems, "\n".join(problems) + "\nrun: python -m verify.figures --write"


def test_a_figure_edited_by_hand_or_an_artifact_that_moved_is_caught(tmp_path: Path) -> None:
    for rel in figures.DOCS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    shutil.copytree(ROOT / figures.RESULTS, tmp_path / figures.RESULTS, dirs_exist_ok=True)
    shutil.copytree(ROOT / "series" / "next", tmp_path / "series" / "next")  # the carry timings' source
    assert figures.check(tmp_path) == []
    doc = tmp_path / figures.H200 / "README.md"
    text = doc.read_text()
    edited = re.sub(r"(\| sm120 \| fp8/fused \| )(\d+)/", lambda m: f"{m[1]}{int(m[2]) - 1}/", text, count=1)
    assert edited != text
    doc.write_text(edited)
    assert any("'forward' differs" in p for p in figures.check(tmp_path))
    doc.write_text(text)
    arms = tmp_path / figures.FORWARD_ARMS
    saved = arms.read_text()
    arms.write_text(saved.replace('"mean_exact_oracle_recall": 0.98', '"mean_exact_oracle_recall": 0.97', 1))
    assert any("forward/arms.json: differs" in p for p in figures.check(tmp_path))
    arms.write_text(saved)
    shutil.rmtree(tmp_path / figures.H200 / "diagnose")
    problems = figures.check(tmp_path)
    assert any("'diagnosis' differs" in p for p in problems)
    rendered, _ = figures.render(text, tmp_path)
    assert "Not measured yet" in rendered


def _means(rel: str) -> dict[tuple[str, int, int], dict[str, float]]:
    import json

    res = json.loads((ROOT / rel).read_text())
    return {
        (e["arm"], e["topk"], e["length_tokens"]): {
            "same": e["recall_tie"]["mean"],
            "exact": e.get("recall_tie_unq", {}).get("mean", float("nan")),
            "reference": e.get("recall_tie_ref", {}).get("mean", float("nan")),
        }
        for e in res["per_length"]
    }


@pytest.mark.parametrize("profile, folder", figures.TIER2_H200_RUNS)
def test_the_cpu_emulation_reproduces_the_h200_run_where_both_have_the_arm(profile: str, folder: str) -> None:
    """README and verify/results/cpu/README.md say so, for each platform profile's H200 run, against
    the same-q oracle and DeepSeek's reference selection; the emulation is exact, so only the GPU's
    fp8 scorer's own rounding may differ."""
    cpu, gpu = _means(f"{figures.CPU}/recall/results.json"), _means(f"{folder}/results.json")
    shared = [k for k in gpu if k in cpu]
    assert len(shared) >= 40
    for oracle in ("same", "reference"):
        worst = max(abs(cpu[k][oracle] - gpu[k][oracle]) for k in shared)
        assert worst < 5e-4, (oracle, worst)


def test_what_the_cpu_readme_says_about_the_q_holds_at_every_length_the_indexer_must_choose() -> None:
    """Against the exact-q oracle: fp8 keys < bf16 keys < bf16 keys with a bf16 q, and the q's
    rounding costs bf16 keys more than what is left after removing it."""
    cpu = _means(f"{figures.CPU}/recall/results.json")
    checked = 0
    for (arm, topk, n), m in cpu.items():
        if arm != "bf16" or n < 4 * topk + 4 * 64:
            continue
        fp8, bf16q = cpu[("fp8", topk, n)]["exact"], cpu[("bf16q", topk, n)]["exact"]
        assert fp8 < m["exact"] < bf16q, (topk, n)
        assert bf16q - m["exact"] > 1 - bf16q, (topk, n)
        checked += 1
    assert checked >= 10


def test_the_deepgemm_block_reads_what_the_committed_logs_say(tmp_path: Path) -> None:
    """The committed logs: the crash, its frame and the preload's return, read from the latest
    call that built DeepGEMM; then the same logs with the preloaded call failing, a later call
    that reused the build (its JIT cache filled), and the stage logs alone."""
    block = figures.deepgemm(ROOT)
    assert "the metadata call: segmentation fault (exit 139)" in block
    assert "`deep_gemm::IncludeParser::get_includes` at `include_parser.hpp:18`" in block
    assert "preloaded: returned" in block and "JIT cache afterwards: none" in block
    assert "context_lens.dim() == 2" in block and "deepgemm `54e2261`" in block
    src = ROOT / figures.DEEPGEMM
    dst = tmp_path / figures.DEEPGEMM
    shutil.copytree(src, dst)
    source = re.search(r"Source `[^`]*/(stage-[^`]*)`", block).group(1)  # type: ignore[union-attr]
    log = dst / source
    body = log.read_text()
    step5 = body.index("--- 5.")
    log.write_text(body[:step5] + body[step5:].replace("\nexit 0\n", "\nexit 139\n"))
    assert "preloaded: segmentation fault (exit 139)" in figures.deepgemm(tmp_path)
    log.write_text(body)
    # a later call on the same machine: the build reused, the JIT cache full; not the source
    later = dst / "stage-99999999-9999.log"
    later.write_text(
        "DeepGEMM build reused from an earlier call on this machine\n"
        + body.replace("No such file", "kernel.sm90_paged_mqa_logits_metadata")
    )
    assert f"Source `{figures.DEEPGEMM}/{source}`" in figures.deepgemm(tmp_path)
    later.unlink()
    for other in dst.glob("*.log"):
        if not other.name.startswith("stage-"):
            other.unlink()
    alone = figures.deepgemm(tmp_path)
    assert "test_attention" not in alone and "preloaded: returned" in alone  # step 5 of the stage log
    shutil.rmtree(dst)
    assert "Not measured yet" in figures.deepgemm(tmp_path)


def test_the_gpu_tests_block_counts_a_failure_in_a_junit_file(tmp_path: Path) -> None:
    logs = tmp_path / figures.H200 / "logs"
    shutil.copytree(ROOT / figures.H200 / "logs", logs)
    assert figures.gpu_tests(tmp_path) == figures.gpu_tests(ROOT)
    newest = max(logs.glob("tests-gpu-*-junit.xml"))
    newest.write_text(newest.read_text().replace('failures="0"', 'failures="1"', 1))
    line = figures.gpu_tests(tmp_path).splitlines()[-1]
    assert ", 1 failed," in line and line != figures.gpu_tests(ROOT).splitlines()[-1]


def test_what_sessions_7_and_8_say_about_the_deepgemm_anchor_holds_in_the_committed_bench() -> None:
    """The results README's session-7 prose that session 8's bench repeats, against
    `bench/session-8/bench_read.json` (session 8's bench, kept beside the latest): DeepGEMM's paged scorer beats the twin's best on every decode shape of
    >= 8K keys, its non-paged call beats every paged path at the long prefill, the grouped MTP mode
    is further from DeepGEMM than from the twin; and the one it does not: at one of the two largest
    decode shapes bf16 at its default config is just past the key-byte ratio of DeepGEMM."""
    read = json.loads((ROOT / figures.H200 / "bench/session-8/bench_read.json").read_text())
    decode = [
        r
        for r in read["results"]
        if r["shape"]["mode"] == "decode" and not r["shape"].get("width") and r["shape"]["keys"] >= 8192
    ]
    assert decode and all(r["fp8_deepgemm"]["ms"] < r["fp8_best"]["ms"] for r in decode)
    for p in read["long_prefill"]:
        paged = [p["arms"][a]["ms"] for a in ("bf16", "fp8_twin", "tilelang")]
        assert all(paged) and p["arms"]["deepgemm_nonpaged"]["ms"] < min(paged)
    for m in read["mtp"]:
        assert m["grouped"]["ms"] / m["deepgemm"]["ms"] > m["grouped"]["ms"] / m["fp8"]["ms"]
    past = [r for r in decode if r["bf16_default"]["ms"] / r["fp8_deepgemm"]["ms"] > 256 / 132]
    assert len(past) == 1 and past[0]["shape"]["rows"] * past[0]["shape"]["keys"] >= 32 * 131072
    assert past[0]["bf16_default"]["ms"] / past[0]["fp8_deepgemm"]["ms"] < 1.01 * 256 / 132


def test_what_session_8_says_about_the_grouped_config_holds_in_its_artifacts() -> None:
    """The results README's session-8 prose: every grouped default fits two programs per SM on the
    H200 and at four rows per request no swept config beats it (two stages, sm_120's choice, and
    eight warps, sm_100's spill-free candidate, both slower, the latter within a few percent);
    compiled for sm_120, four rows at the decode config's stages do not fit and the selected config
    does; the extension linked by the build's compiler defines hundreds of `std::locale` symbols,
    the one linked by the system g++ a handful and runs without a preload; the forward tier's
    four-draft-token arms scored in groups of four, three stages under sm90 and two under sm120."""
    from verify.bench import report

    read = json.loads((ROOT / figures.H200 / "bench/session-8/bench_read.json").read_text())
    for m in read["mtp"]:
        config = m["grouped"]["config"]
        smem = report.grouped_smem_bytes(
            config["block_n"], config["num_stages"], m["next_n"], read["meta"]["heads"]
        )
        assert report.SM_SHARED_BYTES // (smem + report.BLOCK_RESERVED_BYTES) == 2, m["next_n"]
        if m["next_n"] != 4:
            continue
        assert m["grouped_best"]["config"] == config
        swept = {
            (
                t["config"]["num_warps"],
                t["config"]["num_stages"],
                t["config"]["block_n"],
                t["config"]["max_split_n"],
            ): t["ms"]
            for t in m["grouped_sweep"]
            if t["config"]["swap_ab"]
        }
        two_stages, eight_warps = swept[(4, 2, 64, 2048)], swept[(8, 3, 64, 2048)]
        assert (
            two_stages > m["grouped"]["ms"] and m["grouped"]["ms"] < eight_warps < 1.05 * m["grouped"]["ms"]
        )
    compiled = json.loads((ROOT / figures.RESULTS / "sm120/bf16-read-compile.json").read_text())["reports"]
    sm120 = {r["variant"]: r for r in compiled if r["target"] == "sm120"}
    assert (
        sm120["MTP verify, groups of 4"]["shared_bytes"] <= sm120["MTP verify, groups of 4"]["shared_limit"]
    )
    before = next(r for r in sm120.values() if not r["production"])
    assert before["shared_bytes"] > before["shared_limit"]
    sm100 = next(r for r in compiled if r["target"] == "sm100" and r["variant"] == "MTP verify, groups of 4")
    assert sm100["spill_bytes"] > 0
    stage = (ROOT / figures.DEEPGEMM / "stage-20261202-1014.log").read_text()
    counts = [
        int(n)
        for n in re.findall(r"^std::locale symbols defined in the extension: (\d+)$", stage, re.MULTILINE)
    ]
    assert len(counts) == 2 and counts[0] >= 100 and counts[1] < 20
    assert re.search(r"^--- 6\..*\n(?:.*\n)*?metadata \[", stage, re.MULTILINE)
    run = json.loads((ROOT / figures.H200 / "forward/20261202-1015-sm90-sm120/results.json").read_text())
    verify_steps = [r for r in run["steps"] if r["arm"] == "bf16/fused/mtp4" and r["mode"] == "target_verify"]
    by_profile = {r["profile"]: set(r["bf16_launches"]) for r in verify_steps}
    assert by_profile == {"sm90": {"group_rows=4 stages=3"}, "sm120": {"group_rows=4 stages=2"}}
    assert all(r["status"] == "pass" for r in run["steps"])


def test_the_pr_evidence_blocks_render_without_torch() -> None:
    """`nox -s pr_drafts` runs where torch is not installed (CI's tooling venv): every block it
    renders there must import nothing that needs torch."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from pathlib import Path\n"
        "from bf16k import previdence\n"
        "kinds = [k for k in previdence.BLOCKS if k not in previdence.NEEDS_TORCH]\n"
        "out = previdence._render_here(Path(sys.argv[1]), kinds)\n"
        "assert 'reference oracle' in out['recall'], out['recall'][:300]\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(ROOT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
