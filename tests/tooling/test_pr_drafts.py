"""`pr-drafts`: the PR map, one draft per PR, the cover, the per-PR git am (and test) check.

A small synthetic product (three patches on the real pinned upstream: two PRs and a local one)
for the drafter's behaviour and its failure modes; the real series for what the real drafts say.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import textwrap
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from bf16k import cli, gitutil, patches, previdence, prs, series, upstream, upstreamlint
from bf16k import pin as pinmod
from bf16k.errors import ToolError
from bf16k.prdrafts import commits, drafts, prose
from bf16k.prdrafts import tree as prtree
from bf16k.prdrafts import urls as prurls
from bf16k.project import SUBMODULE_PATH, Target

from .conftest import INDEXER, REPO_ROOT, TRAILERS, WHY, Product, make_product

URL = "https://github.com/sgl-project/sglang/pull/40001"
PROBE = "python/sglang/srt/layers/attention/dsv4/bf16k_probe.py"
PROBE_TEST = "test/registered/unit/layers/attention/test_probe.py"
PROBE_TEST_TEXT = textwrap.dedent("""\
    import unittest


    def register_cpu_ci(**kwargs):  # upstream's no-op marker, here without importing sglang (slow)
        return None


    register_cpu_ci(est_time=5, suite="base-a-test-cpu")


    class TestProbe(unittest.TestCase):
        def test_value(self):
            self.assertEqual(1, 1)


    if __name__ == "__main__":
        unittest.main()
""")
NAMES = ["indexer-add-a-marker-line.patch", "add-a-probe-module.patch", "probe-local-tweak.patch"]
MAP = textwrap.dedent("""\
    [[pr]]
    id = "a"
    title = "[DSV4] Indexer: add a marker line"
    patches = ["indexer-add-a-marker-line.patch"]
    motivation = "patch"
    context = "The first PR of the synthetic set."
    needs = ["hicache-gsm8k"]

    [[pr]]
    id = "b"
    title = "[DSV4] Add a probe module"
    patches = ["add-a-probe-module.patch"]
    motivation = "patch"
    context = "The second PR, on top of the first."
    needs = ["gsm8k", "long-context-recall"]

    [[local]]
    patch = "probe-local-tweak.patch"
    why = "Only this product needs it."
""")


def _sections(text: str) -> list[str]:
    return re.findall(r"^## (.+)$", text, re.MULTILINE)


# --------------------------------------------------------------------------- the map


def _map(tmp_path: Path, text: str) -> prs.PRMap:
    path = tmp_path / "prs.toml"
    path.write_text(text)
    return prs.parse(path)


def test_map_that_does_not_describe_the_series_is_refused(tmp_path: Path) -> None:
    fwd = {NAMES[0]: "no", NAMES[1]: "no", NAMES[2]: "not-needed"}
    good = _map(tmp_path, MAP)
    assert prs.problems(good, NAMES, fwd) == []
    assert good.base_patches(good.by_id("b")) == [NAMES[0]] and good.upstream_bound == NAMES[:2]
    # A gap: a patch in no PR and not local.
    without_b = MAP[: MAP.index('[[pr]]\nid = "b"')] + MAP[MAP.index("[[local]]") :]
    gap = _map(tmp_path, without_b)
    assert any(
        "add-a-probe-module.patch: in no PR and not local (a gap" in p for p in prs.problems(gap, NAMES, fwd)
    )
    # A patch in two places; one the series does not have.
    twice = _map(
        tmp_path, MAP.replace('patch = "probe-local-tweak.patch"', 'patch = "add-a-probe-module.patch"')
    )
    found = prs.problems(twice, NAMES, fwd)
    assert any("add-a-probe-module.patch: in the map more than once" in p for p in found)
    assert any("probe-local-tweak.patch: in no PR" in p for p in found)
    ghost = _map(tmp_path, MAP.replace("probe-local-tweak.patch", "gone.patch"))
    assert any(
        "gone.patch: in the map (local) but not in the series" in p for p in prs.problems(ghost, NAMES, fwd)
    )
    # A local patch before an upstream-bound one: the later PR's base would hold it.
    order = [NAMES[0], NAMES[2], NAMES[1]]
    assert any("come before upstream-bound ones" in p for p in prs.problems(good, order, fwd))
    # A PR's patches not contiguous; the PRs out of series order.
    split = _map(
        tmp_path,
        MAP.replace(
            'patches = ["indexer-add-a-marker-line.patch"]',
            'patches = ["indexer-add-a-marker-line.patch", "probe-local-tweak.patch"]',
        ).replace('[[local]]\npatch = "probe-local-tweak.patch"\nwhy = "Only this product needs it."\n', ""),
    )
    assert any(
        "PR 'a': its patches are not contiguous" in p
        for p in prs.problems(split, [NAMES[0], NAMES[1], NAMES[2]], dict.fromkeys(NAMES, "no"))
    )
    assert any("not in series order" in p for p in prs.problems(good, [NAMES[1], NAMES[0], NAMES[2]], fwd))
    # Forwarded: the local patch must say not-needed, a PR's patches must not.
    assert any(
        "local in the map but its header says 'Forwarded: no'" in p
        for p in prs.problems(good, NAMES, dict.fromkeys(NAMES, "no"))
    )
    assert any(
        "in PR 'b' but its header says 'Forwarded: not-needed'" in p
        for p in prs.problems(good, NAMES, fwd | {NAMES[1]: "not-needed"})
    )


def test_map_file_errors_name_the_entry(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="is missing"):
        prs.parse(tmp_path / "nope.toml")
    with pytest.raises(ToolError, match="unknown evidence nonsense"):
        _map(tmp_path, MAP.replace('needs = ["hicache-gsm8k"]', 'evidence = ["nonsense"]'))
    with pytest.raises(ToolError, match="PR id\\(s\\) used twice: a"):
        _map(tmp_path, MAP.replace('id = "b"', 'id = "a"'))
    with pytest.raises(ToolError, match="a PR needs at least one patch"):
        _map(tmp_path, MAP.replace('patches = ["add-a-probe-module.patch"]', "patches = []"))
    with pytest.raises(ToolError, match="motivation 'why' is not one of"):
        _map(tmp_path, MAP.replace('motivation = "patch"', 'motivation = "why"', 1))


def test_pr_url_takes_a_pr_or_a_patch_and_refuses_local_ones(tmp_path: Path) -> None:
    prmap = _map(tmp_path, MAP)
    assert prurls.parse_pr_urls([f"a={URL}"], NAMES, prmap) == {NAMES[0]: URL}
    assert prurls.parse_pr_urls([f"add-a-probe-module={URL}"], NAMES, prmap) == {NAMES[1]: URL}
    with pytest.raises(ToolError, match="local only"):
        prurls.parse_pr_urls([f"probe-local-tweak={URL}"], NAMES, prmap)
    with pytest.raises(ToolError, match="no PR or patch 'nope'"):
        prurls.parse_pr_urls([f"nope={URL}"], NAMES, prmap)
    with pytest.raises(ToolError, match="not an https URL"):
        prurls.parse_pr_urls(["a=http://example.com/1"], NAMES, prmap)
    with pytest.raises(ToolError, match="ID=URL or PATCH=URL"):
        prurls.parse_pr_urls(["a"], NAMES, prmap)


# --------------------------------------------------------------------------- pieces of a draft


def test_local_references_are_found_and_the_live_harness_allowed() -> None:
    lines = [
        "measured on an NVIDIA H200",
        "see `verify/results/h200/parity/store.json`",
        "run /work/main/x",
        "python -m verify.live --server URL --baseline URL",
        "from verify.recall import gate",
        "git am build/x.patch",
        "the carried `series/next/0.5.23/`",
        "nox -s pr_drafts",
        "bf16k tooling",
        "Issue #23 estimated",
    ]
    text = "\n".join(lines)
    found = previdence.local_refs(text)
    assert len(found) == 8 and not any("H200" in f or "verify.live" in f for f in found), found
    # The cover (the maintainers' page) may name this repository's commands, never a machine's path.
    assert [f.split(" in: ")[1] for f in previdence.local_refs(text, strict=False)] == ["run /work/main/x"]


def test_docs_row_is_read_from_the_options_declaration() -> None:
    source = textwrap.dedent("""\
        class ExecKernel(msgspec.Struct):
            enable_x: A[bool, "Enable x. See --other-flag."] = False
            x_dtype: A[
                Optional[str],
                Arg(help="Format of x. " "'a': one | two.", choices=["a", "b"], fallback="a"),
            ] = None
            x_size: A[int, Arg(help="Size.")] = 4
    """)
    fields = prtree._arg_fields(source)
    assert prtree.docs_row("--enable-x", fields["enable_x"]) == (
        "| `--enable-x` | Enable x. See `--other-flag`. | `False` | bool flag (set to enable) |"
    )
    assert (
        prtree.docs_row("--x-dtype", fields["x_dtype"])
        == "| `--x-dtype` | Format of x. 'a': one \\| two. | `a` | `a`, `b` |"
    )
    assert prtree.docs_row("--x-size", fields["x_size"]) == "| `--x-size` | Size. | `4` | Type: int |"


def test_needed_runs_give_the_exact_commands() -> None:
    tree = REPO_ROOT / SUBMODULE_PATH / "python" / "sglang"
    for need in prs.NEEDED_RUNS:
        for ab in (False, True):
            what, commands = prose.needed_runs(need, ab)
            assert what and commands, need
            text = "\n".join(commands)
            # hicache-gsm8k is a fix on the fp8 default: always upstream main vs the PR.
            assert ("--deepseek-v4-indexer-k-dtype bf16" in text) == (
                (ab and need != "hicache-gsm8k") or need == "sm120"
            )
    joined = {n: "\n".join(prose.needed_runs(n, True)[1]) for n in prs.NEEDED_RUNS}
    assert "python3 -m sglang.test.few_shot_gsm8k --num-questions 1319" in joined["gsm8k"]
    assert "sgl-eval run gpqa" in joined["gpqa"]
    assert (
        "python -m verify.live --server http://127.0.0.1:30001 --baseline http://127.0.0.1:30000 "
        "--expect-format bf16 --baseline-expect-format fp8"
    ) in joined["long-context-recall"]
    assert "pip install '.[live]'" in joined["long-context-recall"]
    assert "python3 -m sglang.bench_serving --backend sglang" in joined["bench-serving"]
    assert "max_total_num_tokens" in joined["pool-tokens"] and "/server_info" in joined["pool-tokens"]
    assert "--speculative-algorithm EAGLE" in joined["mtp"] and "avg_spec_accept_length" in joined["mtp"]
    assert "--disaggregation-mode prefill" in joined["sm120"]
    # The upstream modules those commands run exist in the pinned tree.
    if tree.is_dir():
        for module in ("test/few_shot_gsm8k.py", "bench_serving.py", "launch_server.py"):
            assert (tree / module).is_file(), module


# --------------------------------------------------------------------------- a synthetic product


@pytest.fixture(scope="module")
def three(
    tmp_path_factory: pytest.TempPathFactory, base_repo: Path, real_pin: pinmod.Pin
) -> Iterator[Product]:
    """Three patches on the real pinned upstream: PR a (an indexer edit), PR b (a new module and its
    registered test), a local tweak (Forwarded: not-needed); the map in series/prs.toml."""
    p = make_product(tmp_path_factory.mktemp("prs") / "product", base_repo, real_pin)
    p.commit_patch(
        INDEXER,
        "FP8_DTYPE = ",
        "# bf16k test: marker line\nFP8_DTYPE = ",
        "[DSV4] Indexer: add a marker line",
        WHY,
        TRAILERS,
    )
    p.commit_patch(
        PROBE, None, '"""probe module"""\n\nVALUE = 1\n', "[DSV4] Add a probe module", WHY, TRAILERS
    )
    p.commit_patch(PROBE_TEST, None, PROBE_TEST_TEXT, "[DSV4] Add a probe module test", WHY, TRAILERS)
    # Squash the test into the probe commit: one patch adds the module and its test.
    gitutil.git(["reset", "-q", "--soft", "HEAD~2"], p.upstream)
    gitutil.git(
        ["commit", "-q", "-m", f"[DSV4] Add a probe module\n\n{WHY}\n\n{TRAILERS}\n"],
        p.upstream,
        env={"GIT_AUTHOR_DATE": "1700000000 +0000", "GIT_COMMITTER_DATE": "1700000000 +0000"},
    )
    p.commit_patch(
        PROBE,
        "VALUE = 1\n",
        "VALUE = 1\nLOCAL = True\n",
        "[DSV4] Probe: local tweak",
        WHY,
        "Forwarded: not-needed\nLast-Update: 2026-11-29",
    )
    patches.export(p.target)
    assert series.read_order(p.target.series_dir) == NAMES
    (p.target.series_dir / prs.PRS_FILE).write_text(MAP)
    yield p
    shutil.rmtree(p.root, ignore_errors=True)


@pytest.fixture(scope="module")
def drafted(three: Product) -> Path:
    t, chosen = drafts.newest_target(three.root)
    assert t == three.target and chosen == "sglang 0.5.21, the pin"
    return drafts.generate(t, chosen)


def test_drafts_one_per_pr_with_the_map_template_and_no_local_paths(three: Product, drafted: Path) -> None:
    p, out = three, drafted
    assert out == p.root / "build" / "pr-drafts" / "0.5.21"
    assert sorted(f.name for f in out.iterdir()) == ["00-cover.md", "patches", "pr-a.md", "pr-b.md"]
    assert sorted(str(f.relative_to(out / "patches")) for f in (out / "patches").rglob("*.patch")) == [
        "a/0001-indexer-add-a-marker-line.patch",
        "b/0001-add-a-probe-module.patch",
    ]
    cover = (out / "00-cover.md").read_text()
    assert (
        "| (a) | [[DSV4] Indexer: add a marker line](pr-a.md) | `indexer-add-a-marker-line.patch` | upstream |"
        in cover
    )
    assert (
        "| (b) | [[DSV4] Add a probe module](pr-b.md) | `add-a-probe-module.patch` | upstream + a |" in cover
    )
    assert "| `probe-local-tweak.patch` | Only this product needs it. |" in cover
    assert re.search(
        r"\| 0\.5\.21 \(pin\) \| \(b\) \| applies on `[0-9a-f]{12}` \(wheel\) \+ \(a\) \|", cover
    )
    assert "git am -3 --keep-non-patch patches/b/*.patch" in cover
    for name in ("pr-a.md", "pr-b.md"):
        assert previdence.local_refs((out / name).read_text()) == [], name
    assert previdence.local_refs(cover, strict=False) == []
    a, b = (out / "pr-a.md").read_text(), (out / "pr-b.md").read_text()
    for text, title in ((a, "[DSV4] Indexer: add a marker line"), (b, "[DSV4] Add a probe module")):
        assert text.startswith(f"# {title}\n")
        assert _sections(text) == [
            "Motivation",
            "Modifications",
            "Accuracy Tests",
            "Speed Tests and Profiling",
            prose.STILL_NEEDS,
            "Checklist",
            "Review and Merge Process",
        ]
        assert text.count("## Motivation") == 1
    # One motivation: the patch's why (motivation = "patch"), not repeated under Modifications.
    motivation_a = a.split("## Motivation", 1)[1].split("## Modifications", 1)[0]
    assert (
        " ".join(WHY.split()) in motivation_a
        and " ".join(WHY.split()) not in a.split("## Modifications", 1)[1]
    )
    # The tests each PR adds, read by upstream's parser; the box ticked only where one exists.
    assert f"| `{PROBE_TEST}` | CPU `base-a-test-cpu` (~5 s) | added by add-a-probe-module.patch |" in b
    assert f"- [x] {prose.CHECK_TESTS}" in b and f"- [ ] {prose.CHECK_TESTS}" in a
    for text in (a, b):
        assert f"- [ ] {prose.CHECK_DOCS} No user-facing option" in text
        assert f"- [ ] {prose.CHECK_BENCH} None yet" in text  # no artifact: not ticked
        assert f"- [ ] {prose.CHECK_FORMAT}" in text and f"- [ ] {prose.CHECK_STYLE}" in text
    # What only real hardware can give, with its commands (PR b, before any A/B option: before/after).
    needs = b.split(f"## {prose.STILL_NEEDS}", 1)[1].split("## Checklist", 1)[0]
    assert "python3 -m sglang.test.few_shot_gsm8k" in needs and "python -m verify.live --server" in needs
    assert "upstream main vs this PR" in needs
    assert "--enable-hierarchical-cache" in a


def test_patches_apply_with_git_am_each_on_its_base(three: Product, drafted: Path, tmp_path: Path) -> None:
    p, out = three, drafted
    data = (out / "patches" / "a" / "0001-indexer-add-a-marker-line.patch").read_text()
    assert "\nSubject: [DSV4] Indexer: add a marker line\n" in data
    for trailer in ("Forwarded:", "Last-Update:", "Patch-Filename:"):
        assert f"\n{trailer}" not in data
    scratch = tmp_path / "scratch"
    base = gitutil.rev_parse(p.upstream, upstream.BASE_REF)
    gitutil.git(["clone", "-q", "--shared", "--no-checkout", str(p.upstream), str(scratch)], tmp_path)
    gitutil.git(["checkout", "-q", "-B", "main", base], scratch)
    for pr_id in ("a", "b"):
        files = sorted(str(f) for f in (out / "patches" / pr_id).glob("*.patch"))
        gitutil.git(["am", "-q", "--keep-non-patch", *files], scratch)
    # The two PRs are the series without its local patch.
    assert gitutil.out(["rev-parse", "HEAD^{tree}"], scratch) == gitutil.out(
        ["rev-parse", "HEAD~1^{tree}"], p.upstream
    )


def test_check_runs_each_prs_own_tests_on_its_base(three: Product, tmp_path: Path) -> None:
    out = drafts.generate(three.target, "x", tmp_path / "out", check=True)
    cover = (out / "00-cover.md").read_text()
    assert re.search(r"\| 0\.5\.21 \(pin\) \| \(a\) \| applies on [^|]+\| no test files of its own \|", cover)
    assert re.search(
        r"\| 0\.5\.21 \(pin\) \| \(b\) \| applies on [^|]+\+ \(a\) \| 1 passed, 0 skipped in \d+ s \|", cover
    )
    b = (out / "pr-b.md").read_text()
    assert "Applied with `git am` on SGLang 0.5.21 + PR (a), the tests above pass on a CPU machine" in b
    assert "1 passed, 0 skipped" in b


def test_a_pr_that_does_not_apply_on_its_base_is_reported(three: Product, tmp_path: Path) -> None:
    prmap = prs.load(three.target)
    dirs = commits.write_pr_patches(three.target.series_dir, prmap, tmp_path / "patches")
    first = next(dirs["a"].glob("*.patch"))
    first.write_bytes(first.read_bytes().replace(b"\n FP8_DTYPE = ", b"\n FP8_DTYPE_RENAMED = ", 1))
    rc = prtree.check_release(three.target, prmap, dirs, "0.5.21 (pin)", None)
    assert rc.checked and [c.pr for c in rc.prs] == ["a"] and not rc.prs[0].applies  # (b) has no base
    assert "Patch failed at 0001 [DSV4] Indexer: add a marker line" in rc.prs[0].detail
    assert drafts.check_verdict([rc])[0] == 1


def test_check_verdict_fails_on_any_pr_or_release_not_shown_good() -> None:
    from bf16k.seriestests import Failure, TestRun

    good = TestRun(Path("."), passed=3)
    failing = TestRun(Path("."), passed=2, failures=[Failure("t.py::x", "boom")])
    ok = prs.ReleaseCheck(
        "0.5.21 (pin)",
        True,
        prs=[prs.PRCheck("a", True, run=good), prs.PRCheck("b", True, run=TestRun(Path("."), absent=True))],
    )
    assert drafts.check_verdict([ok]) == (
        0,
        ["every PR applies on its base and its tests pass, on 0.5.21 (pin)"],
    )
    stale = prs.ReleaseCheck(
        "0.5.23 (carried)", False, ["its series does not fit the PR map (x): re-carry it first"]
    )
    code, lines = drafts.check_verdict([ok, stale])
    assert code == 1 and lines == [
        "0.5.23 (carried): not checked: its series does not fit the PR map (x): re-carry it first"
    ]
    broken = prs.ReleaseCheck(
        "0.5.21 (pin)", True, prs=[prs.PRCheck("a", True, run=failing), prs.PRCheck("b", False)]
    )
    code, lines = drafts.check_verdict([broken])
    assert (
        code == 1 and "does not apply or its tests fail: 0.5.21 (pin) PR (a), 0.5.21 (pin) PR (b)" in lines[0]
    )


def test_a_carried_series_is_drafted_only_when_it_fits_the_map(three: Product) -> None:
    p = three
    nxt = p.root / "series" / "next"
    try:
        for version, drop in (("0.5.23", None), ("0.5.24", NAMES[2])):
            d = nxt / version
            d.mkdir(parents=True)
            for name in [*NAMES, series.SERIES_FILE]:
                shutil.copy(p.target.series_dir / name, d / name)
            if drop:
                (d / drop).unlink()
                series.write_order(d, [n for n in NAMES if n != drop])
            pin = pinmod.load(p.root / "pin.toml")
            pin.version, pin.tag, pin.commit = version, f"v{version}", ""
            pinmod.save(pin, d / "pin.toml")
        t, chosen = drafts.newest_target(p.root)
        assert t == Target(p.root, "0.5.23")
        assert (
            "0.5.24 (its carried series does not fit the PR map, 1 problem(s), first: probe-local-tweak.patch"
            in chosen
        )
        out = drafts.generate(t, chosen)
        cover = (out / "00-cover.md").read_text()
        assert out.name == "0.5.23" and "the newest release the series is carried to" in cover
        assert (
            "| 0.5.23 (carried) | all | not checked:" in cover
            and "nox -s apply -- --upstream 0.5.23" in cover
        )
    finally:
        shutil.rmtree(nxt, ignore_errors=True)


def test_pr_url_refuses_a_tree_not_applied_at_the_current_series(three: Product) -> None:
    p = three
    path = p.target.series_dir / NAMES[1]
    before = path.read_bytes()
    try:
        path.write_bytes(before.replace(b"VALUE = 1", b"VALUE = 2"))
        with pytest.raises(ToolError, match="not applied at the current series hash"):
            prurls.record_pr_urls(p.target, {NAMES[0]: URL})
        assert b"Forwarded: no" in (p.target.series_dir / NAMES[0]).read_bytes()
    finally:
        path.write_bytes(before)


def test_pr_url_records_an_opened_pr_on_its_patches_and_check_still_passes(
    three: Product, capsys: pytest.CaptureFixture[str]
) -> None:
    """Last in the module: it rewrites the product's series."""
    p = three
    tree = gitutil.out(["rev-parse", "HEAD^{tree}"], p.upstream)
    others = {n: (p.target.series_dir / n).read_bytes() for n in NAMES[1:]}
    assert cli.main(["--root", str(p.root), "pr-drafts", "--pr-url", f"a={URL}"]) == 0
    assert f"{NAMES[0]}: Forwarded: {URL}" in capsys.readouterr().out
    text = (p.target.series_dir / NAMES[0]).read_text()
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert f"\nForwarded: {URL}\nLast-Update: {today}\nPatch-Filename: {NAMES[0]}\n" in text
    assert {n: (p.target.series_dir / n).read_bytes() for n in NAMES[1:]} == others
    assert gitutil.out(["rev-parse", "HEAD^{tree}"], p.upstream) == tree  # only messages changed
    assert patches.check(p.target).problems == []
    out = p.root / "build" / "pr-drafts" / "0.5.21"
    assert f"| opened as | {URL} |" in (out / "pr-a.md").read_text()
    assert f"| {URL} |" in (out / "00-cover.md").read_text()
    assert "opened as" not in (out / "pr-b.md").read_text()


# --------------------------------------------------------------------------- the real series


def _real() -> Target:
    t = Target(REPO_ROOT, None)
    try:
        upstreamlint.applied(t)
    except ToolError as exc:
        pytest.skip(f"the real series is not applied here: {exc}")
    return t


def test_evidence_is_the_committed_artifacts_through_their_renderers() -> None:
    figures = previdence._verify("verify.figures")
    blocks = previdence.render(REPO_ROOT, list(previdence.BLOCKS))
    for kind, text in blocks.items():
        assert previdence.local_refs(text) == [], kind
        assert previdence.NOT_MEASURED not in text, kind
    # The cost tables are verify.figures' cost block's own rows, from cost.json.
    rows = [line for line in figures.cost(REPO_ROOT).splitlines() if line.startswith("|")]
    assert rows and all(row in blocks["cost"] for row in rows)
    cost = json.loads((REPO_ROOT / "verify/results/cost/cost.json").read_text())
    flash = next(m for m in cost["models"] if m["shape"]["name"] == "DeepSeek-V4-Flash")
    assert f"{next(c for c in flash['capacity'] if c['fmt'] == 'bf16')['full_tokens']:,}" in blocks["cost"]
    # Parity counts are the artifact's.
    store = json.loads((REPO_ROOT / "verify/results/h200/parity/store.json").read_text())["results"]
    passed = sum(r["status"] == "pass" for r in store)
    assert f"**{passed}/{len(store)} checks pass**" in blocks["store-parity"]
    # Missing artifacts are said to be missing, never filled in.
    empty = previdence.render(Path("/nonexistent"), ["store-parity", "read-bench", "recall", "cost"])
    assert all(previdence.NOT_MEASURED in v for v in empty.values())


def test_blocks_needing_torch_are_rendered_by_a_python_that_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """nox runs pr_drafts in its own interpreter (no torch): the forward and cost blocks are then
    rendered in a subprocess by the test environment's Python. Here with a block that needs no torch,
    so the subprocess stays cheap."""
    import importlib.util
    import sys

    real = importlib.util.find_spec
    monkeypatch.setattr(previdence, "NEEDS_TORCH", ("store-parity",))
    monkeypatch.setattr(
        previdence.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    monkeypatch.setenv("BF16K_TEST_PYTHON", sys.executable)
    calls: list[list[str]] = []
    run = previdence.subprocess.run

    def spy(cmd: list[str], **kw: object) -> object:
        calls.append(cmd)
        return run(cmd, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(previdence.subprocess, "run", spy)
    out = previdence.render(REPO_ROOT, ["store-parity", "fp8-precision"])
    assert [c[1:3] for c in calls if "bf16k.previdence" in c] == [["-m", "bf16k.previdence"]]
    assert out["store-parity"] == previdence.parity_block(REPO_ROOT, "store")
    assert out["fp8-precision"] == previdence.fp8_precision(REPO_ROOT)


def test_real_series_drafts(tmp_path: Path) -> None:
    t = _real()
    prmap = prs.load(t)
    assert [p.id for p in prmap.prs] == ["a", "b", "c"]
    assert [loc.patch for loc in prmap.local] == ["bf16-index-k-aliases.patch", "indexer-capture.patch"]
    out = drafts.generate(t, "sglang 0.5.21, the pin", tmp_path / "out")
    cover = (out / "00-cover.md").read_text()
    for pr in prmap.prs:
        assert f"[{pr.title}](pr-{pr.id}.md) | " + "<br>".join(f"`{n}`" for n in pr.patches) in cover
        assert re.search(rf"\| 0\.5\.21 \(pin\) \| \({pr.id}\) \| applies on ", cover), pr.id
    texts = {pr.id: (out / f"pr-{pr.id}.md").read_text() for pr in prmap.prs}
    for pr_id, text in texts.items():
        assert previdence.local_refs(text) == [], pr_id
        assert text.count("## Motivation") == 1 and f"## {prose.STILL_NEEDS}" in text
    a, b, c = texts["a"], texts["b"], texts["c"]
    # (a) the bugfix: its own why, its test, no kernel evidence and nothing ticked it has not.
    assert "token-granular copy" in a.split("## Modifications")[0] and "lightning indexer" not in a
    assert "CPU `base-a-test-cpu`" in a and f"- [x] {prose.CHECK_TESTS}" in a
    assert f"- [ ] {prose.CHECK_BENCH}" in a and "Kernel parity" not in a
    # (b) and (c): the one bf16 motivation, with the public collapses linked and the cost.
    for text in (b, c):
        motivation = text.split("## Modifications")[0]
        assert "bf16 is the reference's container, not its precision" in motivation
        assert (
            "22,597 tokens" in motivation
            and "https://github.com/vllm-project/vllm/issues/55927" in motivation
        )
        assert all(url in motivation for _, url in prose.PUBLIC_COLLAPSES)
        assert "KV-pool tokens" in motivation and f"- [x] {prose.CHECK_BENCH}" in text
        assert (
            text.count("4.5K tokens") == 1
        )  # one motivation: the first commit's field story is not repeated
    assert (
        "**Kernel parity, store**" in b
        and "**Kernel parity, read**" not in b
        and "**Indexer recall**" not in b
    )
    assert "**Kernel parity, read**" in c and "**Indexer forward**" in c and "**Indexer recall**" in c
    assert "SGLANG_DSV4_UNFUSED_INDEXER_COMPRESSOR" in b.split("## Accuracy Tests")[0]
    # (c) carries the docs rows, in the doc's table format, read from the option's declaration.
    assert "| Argument | Description | Defaults | Options |" in c
    assert re.search(
        r"^\| `--deepseek-v4-indexer-k-dtype` \| Experimental\. .* \| `fp8` \| `fp8`, `fp4`, `bf16` \|$",
        c,
        re.MULTILINE,
    )
    assert (
        "| `--enable-deepseek-v4-fp4-indexer` | Deprecated: use `--deepseek-v4-indexer-k-dtype fp4`. | `False` | "
        "bool flag (set to enable) |"
    ) in c
    assert "Deprecation: `--enable-deepseek-v4-fp4-indexer` keeps working" in c
    assert f"- [ ] {prose.CHECK_DOCS} The rows are in this description" in c
    needs = c.split(f"## {prose.STILL_NEEDS}")[1]
    for command in (
        "sglang.test.few_shot_gsm8k",
        "sgl-eval run gpqa",
        "python -m verify.live",
        "sglang.bench_serving",
        "max_total_num_tokens",
        "avg_spec_accept_length",
        "RTX PRO 6000",
    ):
        assert command in needs, command


def test_the_prose_templates_ship_with_the_package() -> None:
    """The drafts' prose is read with importlib.resources: pyproject's package data must carry every
    template into an installed (not editable) bf16k, and each must have sections to read."""
    shipped = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "bf16k"
    ]
    templates = sorted((REPO_ROOT / "bf16k" / "templates").iterdir())
    assert templates
    for path in templates:
        assert any(fnmatch.fnmatch(f"templates/{path.name}", pattern) for pattern in shipped), path.name
        assert prose.sections(path.stem), path.name
