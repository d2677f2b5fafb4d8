"""`pr-drafts`: upstream PR drafts from the fixture series (a real upstream file edited, a new file)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from bf16k import gitutil, patches, prdrafts, upstream
from bf16k import pin as pinmod
from bf16k.errors import ToolError
from bf16k.project import Target

from .conftest import INDEXER, Product

FIRST = "indexer-add-a-marker-line"
SECOND = "add-a-probe-module"
URL = "https://github.com/sgl-project/sglang/pull/40001"


def _generate(p: Product, **kwargs: str) -> Path:
    t, chosen = prdrafts.newest_target(p.root)
    return prdrafts.generate(t, chosen, **kwargs)  # type: ignore[arg-type]


def _cli(p: Product, *args: str) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root")
    prdrafts.register(parser.add_subparsers(dest="command"))
    ns = parser.parse_args(["--root", str(p.root), "pr-drafts", *args])
    return int(ns.func(ns))


def _sections(text: str) -> list[str]:
    return re.findall(r"^## (.+)$", text, re.MULTILINE)


def test_drafts_have_titles_sections_checklist_and_no_invented_numbers(two_patch_product: Product) -> None:
    p = two_patch_product
    out = _generate(p)
    assert out == p.root / "build" / "pr-drafts" / "0.5.21"
    assert sorted(f.name for f in out.iterdir()) == ["00-cover.md", f"01-{FIRST}.md", f"02-{SECOND}.md", "patches"]
    assert sorted(f.name for f in (out / "patches").iterdir()) == [f"0001-{FIRST}.patch", f"0002-{SECOND}.patch"]

    first = (out / f"01-{FIRST}.md").read_text()
    assert first.startswith("# [DeepSeek-V4] Indexer: add a marker line\n")
    assert (out / f"02-{SECOND}.md").read_text().startswith("# [DeepSeek-V4] Add a probe module\n")
    template = list(prdrafts.HEADINGS)
    for text in (first, (out / "00-cover.md").read_text()):
        assert _sections(text)[: len(template)] == template
        for item in (prdrafts.CHECK_FORMAT, prdrafts.CHECK_TESTS, prdrafts.CHECK_DOCS, prdrafts.CHECK_BENCH,
                     prdrafts.CHECK_STYLE):
            assert re.search(rf"^- \[[ x]\] {re.escape(item)}", text, re.MULTILINE), item
    # Motivation: the patch's own why-paragraph and the field report's numbers.
    assert "fp8 index keys of the C4 indexer lose needle recall" in first
    assert "~4.5K tokens" in first and "22,597" in first
    # Modifications: the diffstat of the real upstream file.
    assert f"| `{INDEXER}` | 1 | 0 |" in first
    assert "| Forwarded | no |" in first and "| depends on | none (first in the series) |" in first
    # No results yet: the relevant tiers say so instead of showing numbers.
    assert "_not yet measured_" in first and "Tier 2, indexer recall" in first
    assert f"- [ ] {prdrafts.CHECK_BENCH}: not yet measured." in first

    cover = (out / "00-cover.md").read_text()
    assert "the pinned series (`series/`)" in cover  # which release it was drafted against
    assert "132 B per key" in cover and "256 B per key" in cover and "22,597 tokens" in cover
    assert cover.count("_not yet measured_") == 6  # store/read parity, recall, live, store/read bench
    assert f"[[DeepSeek-V4] Indexer: add a marker line](01-{FIRST}.md)" in cover
    assert "apply with `git am` on base" in cover and "same tree as the applied series" in cover
    assert "git am -3 --keep-non-patch build/pr-drafts/0.5.21/patches/*.patch" in cover


def test_patches_are_ready_for_git_am_with_upstream_subjects(two_patch_product: Product) -> None:
    p = two_patch_product
    out = _generate(p)
    data = (out / "patches" / f"0001-{FIRST}.patch").read_text()
    assert "\nSubject: [DeepSeek-V4] Indexer: add a marker line\n" in data
    for trailer in ("Forwarded:", "Last-Update:", "Patch-Filename:"):
        assert f"\n{trailer}" not in data
    # Apply them with `git am` (as the cover says) on the upstream base, as a reviewer would.
    scratch = p.root / "scratch"
    base = gitutil.rev_parse(p.upstream, upstream.BASE_REF)
    gitutil.git(["clone", "-q", "--shared", "--no-checkout", str(p.upstream), str(scratch)], p.root)
    gitutil.git(["checkout", "-q", "-B", "main", base], scratch)
    names = sorted(f.name for f in (out / "patches").iterdir())
    gitutil.git(["am", "-q", "--keep-non-patch", *[str(out / "patches" / n) for n in names]], scratch)
    assert gitutil.out(["rev-parse", "HEAD^{tree}"], scratch) == gitutil.out(["rev-parse", "HEAD^{tree}"], p.upstream)
    assert gitutil.out(["log", "-1", "--format=%s", "HEAD~1"], scratch) == "[DeepSeek-V4] Indexer: add a marker line"


def _write_results(root: Path) -> None:
    parity = root / "verify" / "results" / "parity_read" / "parity_read.json"
    parity.parent.mkdir(parents=True)
    parity.write_text(json.dumps({
        "suite": "parity_read", "ok": True, "meta": {"gpu": "H200"},
        "results": [
            {"name": "oracle[q=fp8,H=64]", "status": "pass", "summary": "calc_diff 1.23e-07 <= 5e-6", "seconds": 1.0},
            {"name": "graph-replay", "status": "skip", "summary": "no CUDA", "seconds": 0.0},
        ],
    }))  # fmt: skip
    recall = root / "verify" / "results" / "recall" / "summary.csv"
    recall.parent.mkdir(parents=True)
    recall.write_text("length_tokens,arm,needle_hit,recall\n4509,bf16,1.0,0.9987\n4509,fp8,0.0,0.9791\n")
    bench = root / "verify" / "results" / "bench_read" / "bench_read.json"
    bench.parent.mkdir(parents=True)
    bench.write_text(json.dumps({"suite": "bench_read", "results": [
        {"shape": {"mode": "decode", "keys": 8192}, "derived": {"bf16_hbm_pct": 83.5, "ratio_bf16_over_fp8": 1.71}},
    ]}))  # fmt: skip
    (root / "verify" / "results" / "live").mkdir(parents=True)
    (root / "verify" / "results" / "live" / "summary.json").write_text("{ not json")


def test_evidence_tables_come_from_the_results_files(two_patch_product: Product) -> None:
    p = two_patch_product
    _write_results(p.root)
    out = _generate(p)
    cover = (out / "00-cover.md").read_text()
    assert "Source: `verify/results/parity_read/parity_read.json` (not committed yet)" in cover
    assert "suite `parity_read`: all checks pass; 1 pass, 1 skip" in cover
    assert "| oracle[q=fp8,H=64] | pass | calc_diff 1.23e-07 <= 5e-6 |" in cover
    assert "| 4509 | fp8 | 0.0 | 0.9791 |" in cover
    assert "| decode | 8192 | 83.5 | 1.71 |" in cover  # nested JSON flattened, numbers as written
    assert "Tier 1, kernel parity" in cover and "_not yet measured_" in cover  # store parity: none
    assert "could not be read (JSONDecodeError" in cover  # a broken file is reported, not guessed
    assert f"- [x] {prdrafts.CHECK_BENCH}: see the tables above." in cover
    # The indexer patch gets the recall and live tiers; the probe module refers to the cover.
    first = (out / f"01-{FIRST}.md").read_text()
    assert "| 4509 | bf16 | 1.0 | 0.9987 |" in first and "parity_read.json" not in first
    second = (out / f"02-{SECOND}.md").read_text()
    assert "Series-level accuracy evidence is in the [cover](00-cover.md)." in second
    # Committed results lose the "not committed yet" note.
    gitutil.git(["add", "verify"], p.root)
    gitutil.git(["commit", "-q", "-m", "results"], p.root)
    cover = (_generate(p) / "00-cover.md").read_text()
    assert "Source: `verify/results/parity_read/parity_read.json`\n" in cover


def test_pr_url_updates_forwarded_and_check_still_passes(two_patch_product: Product,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    p = two_patch_product
    tree = gitutil.out(["rev-parse", "HEAD^{tree}"], p.upstream)
    second_before = (p.target.series_dir / f"{SECOND}.patch").read_bytes()
    assert _cli(p, "--pr-url", f"{FIRST}={URL}") == 0
    assert f"{FIRST}.patch: Forwarded: {URL}" in capsys.readouterr().out
    text = (p.target.series_dir / f"{FIRST}.patch").read_text()
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert f"\nForwarded: {URL}\nLast-Update: {today}\nPatch-Filename: {FIRST}.patch\n" in text
    assert (p.target.series_dir / f"{SECOND}.patch").read_bytes() == second_before
    assert gitutil.out(["rev-parse", "HEAD^{tree}"], p.upstream) == tree  # only messages changed
    assert patches.check(p.target).problems == []
    draft = (p.root / "build" / "pr-drafts" / "0.5.21" / f"01-{FIRST}.md").read_text()
    assert f"| Forwarded | {URL} |" in draft
    cover = (p.root / "build" / "pr-drafts" / "0.5.21" / "00-cover.md").read_text()
    assert f"| {URL} |" in cover and "| no |" in cover
    # The same URL again changes nothing.
    before = text
    assert _cli(p, "--pr-url", f"{FIRST}.patch={URL}") == 0
    assert (p.target.series_dir / f"{FIRST}.patch").read_text() == before


def test_pr_url_is_validated() -> None:
    names = [f"{FIRST}.patch", f"{SECOND}.patch"]
    with pytest.raises(ToolError, match="no patch 'nope'"):
        prdrafts.parse_pr_urls(["nope=" + URL], names)
    with pytest.raises(ToolError, match="not an https URL"):
        prdrafts.parse_pr_urls([f"{FIRST}=http://example.com/1"], names)
    with pytest.raises(ToolError, match="PATCH=URL"):
        prdrafts.parse_pr_urls([FIRST], names)


def test_pr_url_refuses_a_tree_not_applied_at_the_current_series(two_patch_product: Product) -> None:
    p = two_patch_product
    path = p.target.series_dir / f"{SECOND}.patch"
    path.write_bytes(path.read_bytes().replace(b"VALUE = 1", b"VALUE = 2"))
    with pytest.raises(ToolError, match="not applied at the current series hash"):
        prdrafts.record_pr_urls(p.target, {f"{FIRST}.patch": URL})
    assert b"Forwarded: no" in (p.target.series_dir / f"{FIRST}.patch").read_bytes()


def test_newest_carried_series_is_the_one_drafted(two_patch_product: Product) -> None:
    """A carried series newer than the pin wins; without its tree the git am check says so."""
    p = two_patch_product
    for version in ("0.5.22", "0.5.23"):
        carried = p.root / "series" / "next" / version
        carried.mkdir(parents=True)
        for f in p.target.series_dir.iterdir():
            if f.is_file():
                shutil.copy(f, carried / f.name)
        pin = pinmod.load(p.root / "pin.toml")
        pin.version, pin.tag, pin.commit = version, f"v{version}", ""
        pinmod.save(pin, carried / "pin.toml")
    t, chosen = prdrafts.newest_target(p.root)
    assert t == Target(p.root, "0.5.23") and "series/next/0.5.23/" in chosen
    out = prdrafts.generate(t, chosen)
    assert out == p.root / "build" / "pr-drafts" / "0.5.23"
    cover = (out / "00-cover.md").read_text()
    assert "sglang 0.5.23: the newest carried series (`series/next/0.5.23/`; the pin is 0.5.21)" in cover
    assert "not checked here (the upstream tree is not set up" in cover
    assert "not recorded for this release" in cover


def test_motivation_quotes_fp8_precision_from_the_recall_artifact(tmp_path):
    from bf16k import prdrafts

    assert "not yet measured" in prdrafts.precision_sentence(tmp_path)
    art = tmp_path / prdrafts.RECALL_ARTIFACT
    art.parent.mkdir(parents=True)
    rows = [{"arm": "fp8", "topk": 512, "n_keys_max": 1127, "loss": 0.0068},
            {"arm": "fp8", "topk": 512, "n_keys_max": 32768, "loss": 0.0135},
            {"arm": "fp8", "topk": 512, "n_keys_max": 84, "loss": 0.0},  # the indexer does not choose
            {"arm": "bf16", "topk": 512, "n_keys_max": 1127, "loss": 0.0006}]
    art.write_text(__import__("json").dumps({"per_length": rows}))
    sentence = prdrafts.precision_sentence(tmp_path)
    assert "0.68-1.35% of the top-512" in sentence and prdrafts.RECALL_ARTIFACT in sentence
    assert sentence in prdrafts.field_report(tmp_path)
