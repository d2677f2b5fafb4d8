"""`upstream-lint`: the series' code held to what upstream SGLang accepts (run by `nox -s lint`).

Three checks, each over what goes upstream:

1. Format. Upstream's own files at the pin are `ruff format` (default settings, line length 88)
   and ruff-isort (``--select I``, ``known-first-party = ["sglang"]``) clean, so every Python file
   the series touches must be too, in the applied tree. ruff runs ``--isolated``: the product's
   own ruff settings (line length 110) are not upstream's.
2. Production code. The added lines of the upstream-bound patches in ``python/sglang/`` (outside
   its ``test`` package) name nothing of this product (``verify.``, ``bf16k``, its tiers) and hold
   no Triton-interpreter branch (``TRITON_INTERPRET``, ``_INTERPRETED``, "interpret..."); no added
   line anywhere holds a local path or imports the product's packages.
3. Tests. Each upstream-bound patch adds a test under ``test/registered/``, and each test file it
   adds registers with ``register_cuda_ci`` or ``register_cpu_ci`` in a form upstream's own
   parser accepts (``ut_parse_one_file`` from the applied tree's
   ``python/sglang/test/ci/ci_register.py``), with the main entry (``__name__ == "__main__"``)
   that upstream's ``collect_tests`` requires of a file with an enabled registration.

Which patches are upstream-bound comes from the PR map (``series/prs.toml``, :mod:`bf16k.prs`);
a map that does not fit the series is itself a finding.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from bf16k import diffs, gitutil, prs, series, upstream
from bf16k.errors import ToolError
from bf16k.project import Target

RUFF_VERSION = "0.17.6"  # the version the noxfile's lint session installs
RUFF_FORMAT = (
    "format",
    "--isolated",
    "--check",
    "--no-cache",
    "--line-length",
    "88",
    "--output-format",
    "concise",
)
RUFF_ISORT = (
    "check",
    "--isolated",
    "--select",
    "I",
    "--config",
    'lint.isort.known-first-party = ["sglang"]',
    "--output-format",
    "concise",
    "--no-cache",
)
CI_REGISTER = "python/sglang/test/ci/ci_register.py"
REGISTERED = "test/registered/"
WANTED_BACKENDS = ("CUDA", "CPU")  # register_cuda_ci / register_cpu_ci

# (pattern, what it is): forbidden in the added production lines of upstream-bound patches.
PRODUCTION_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bverify\.[A-Za-z_]"), "names the product's verification harness (verify.*)"),
    (re.compile(r"bf16k", re.IGNORECASE), "names the product's tooling (bf16k)"),
    (re.compile(r"\btier[ -]?[0-9]\b", re.IGNORECASE), "names the product's verification tiers"),
    (re.compile(r"TRITON_INTERPRET"), "a Triton-interpreter switch (TRITON_INTERPRET)"),
    (re.compile(r"_INTERPRETED"), "a Triton-interpreter flag (_INTERPRETED)"),
    (re.compile(r"\binterpret", re.IGNORECASE), "an interpreter branch or note"),
)
# Forbidden in every added line (code, tests, docs).
ANYWHERE_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"/work/|/home/[A-Za-z]|/Users/|/root/|C:\\\\Users"), "a local path"),
    (
        re.compile(r"sglang-upstream|verify/results|build/(pr-drafts|upstream|wheel|gpu)|\.nox/"),
        "a path of this product's repository",
    ),
    (re.compile(r"^\s*(from|import)\s+(verify|bf16k)\b"), "imports the product's packages"),
)


@dataclass(frozen=True)
class Finding:
    check: str  # format | isort | production | anywhere | tests | map
    where: str
    message: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.where}: {self.message}"


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings


# --------------------------------------------------------------------------- patches' added lines


def added_lines(data: bytes) -> Iterator[tuple[str, int, str]]:
    """(file, line number in the new file, text) of every line a patch adds."""
    _, diff = series.split_message(data)
    for fd in diffs.parse(diff.decode("utf-8", errors="replace")):
        if fd.deleted:  # it adds nothing
            continue
        for hunk in fd.hunks:
            line = hunk.new_start
            for raw in hunk.lines:
                if raw.startswith("+"):
                    yield fd.path, line, raw[1:]
                if raw[:1] in ("+", " "):
                    line += 1


def is_production(path: str) -> bool:
    """Shipped code: python/sglang/** outside its test package."""
    return path.startswith(series.ALLOWED_PREFIX) and not path.startswith("python/sglang/test/")


def scan_patch(name: str, data: bytes) -> list[Finding]:
    """Rule findings over the lines one patch adds."""
    out: list[Finding] = []
    for file, line, text in added_lines(data):
        where = f"{name}: {file}:{line}"
        if is_production(file):
            for pattern, what in PRODUCTION_RULES:
                if pattern.search(text):
                    out.append(Finding("production", where, f"{what}: {text.strip()[:120]}"))
        for pattern, what in ANYWHERE_RULES:
            if pattern.search(text):
                out.append(Finding("anywhere", where, f"{what}: {text.strip()[:120]}"))
    return out


# --------------------------------------------------------------------------- upstream's parser


@dataclass(frozen=True)
class Registration:
    backend: str  # CUDA, CPU, AMD, ...
    est_time: float
    suite: str | None
    stage: str | None
    runner_config: str | None
    nightly: bool
    disabled: str | None

    @property
    def label(self) -> str:
        where = self.suite or f"{self.stage}-test-{self.runner_config}"
        extra = (", nightly" if self.nightly else "") + (
            f", disabled: {self.disabled}" if self.disabled else ""
        )
        return f"{self.backend} `{where}` (~{self.est_time:g} s{extra})"


@dataclass(frozen=True)
class Parsed:
    registrations: tuple[Registration, ...]
    has_main_entry: bool
    error: str = ""  # upstream's parser refused the file


def load_ci_register(tree: Path) -> ModuleType:
    """Upstream's ci_register module, loaded from the tree's file (``sglang`` itself not imported)."""
    path = tree / CI_REGISTER
    if not path.is_file():
        raise ToolError(f"{path} is missing: the upstream tree has no CI registry parser")
    name = f"_bf16k_ci_register_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ToolError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # upstream's file: reported as it failed
        raise ToolError(f"{path} does not load: {type(exc).__name__}: {exc}") from exc
    if not callable(getattr(module, "ut_parse_one_file", None)):
        raise ToolError(f"{path} has no ut_parse_one_file")
    return module


def parse_test(ci: ModuleType, text: str, name: str) -> Parsed:
    """Upstream's ``ut_parse_one_file`` over a test file's text (``name``: for its messages)."""
    with tempfile.TemporaryDirectory(prefix="bf16k-ci-") as tmp:
        path = Path(tmp) / Path(name).name
        path.write_text(text)
        try:
            registries, has_main = ci.ut_parse_one_file(str(path))
        except (ValueError, SyntaxError) as exc:
            return Parsed((), False, str(exc).replace(str(path), name))
    regs = tuple(
        Registration(
            str(getattr(r.backend, "name", r.backend)),
            float(r.est_time),
            r.suite,
            r.stage,
            r.runner_config,
            bool(r.nightly),
            r.disabled,
        )
        for r in registries
    )
    return Parsed(regs, bool(has_main))


def test_problems(parsed: Parsed) -> list[str]:
    """What upstream's CI collection would refuse or silently skip about one test file."""
    if parsed.error:
        return [f"upstream's ut_parse_one_file refuses it: {parsed.error}"]
    if not parsed.registrations:
        return ["no CI registration (register_cuda_ci / register_cpu_ci): upstream's CI never runs it"]
    out = []
    if not any(r.backend in WANTED_BACKENDS for r in parsed.registrations):
        out.append(
            "registers for neither CUDA nor CPU CI: " + ", ".join(r.backend for r in parsed.registrations)
        )
    if any(r.disabled is None for r in parsed.registrations) and not parsed.has_main_entry:
        out.append(
            'no `if __name__ == "__main__":` entry that calls something: upstream\'s collect_tests refuses '
            "it (`python3 file.py`, how its CI runs a file, would run nothing); add `unittest.main()` or "
            '`sys.exit(pytest.main([__file__, "-v"]))`'
        )
    return out


def is_registered_test(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return path.startswith(REGISTERED) and name.startswith("test_") and name.endswith(".py")


# --------------------------------------------------------------------------- ruff


def find_ruff(given: str | None = None) -> str:
    ruff = given or shutil.which("ruff")
    if not ruff:
        raise ToolError(
            f"ruff is not on PATH: run this through `nox -s lint` (it installs ruff=={RUFF_VERSION})"
        )
    return ruff


def ruff_if_any(root: Path) -> str | None:
    """A ruff to check with where one is at hand (on PATH, else the lint session's venv), else None."""
    found = shutil.which("ruff")
    venv = root / ".nox" / "lint" / "bin" / "ruff"
    return found or (str(venv) if venv.is_file() else None)


def ruff_version(ruff: str) -> str:
    proc = subprocess.run([ruff, "--version"], capture_output=True, text=True, check=False)
    return proc.stdout.strip().split()[-1] if proc.returncode == 0 and proc.stdout.strip() else "?"


def ruff_findings(tree: Path, files: list[str], ruff: str) -> list[Finding]:
    """`ruff format --check` and ruff's isort over ``files`` (tree-relative), upstream's settings."""
    if not files:
        return []
    out: list[Finding] = []
    fmt = subprocess.run([ruff, *RUFF_FORMAT, *files], cwd=tree, capture_output=True, text=True, check=False)
    if fmt.returncode not in (0, 1):
        raise ToolError(f"ruff format failed: {(fmt.stderr or fmt.stdout).strip()[:500]}")
    for line in fmt.stdout.splitlines():
        # `path:line:col: unformatted: ...` (ruff >= 0.9, concise); `Would reformat: path` before.
        m = re.match(r"^(.+?):\d+:\d+: unformatted\b", line) or re.match(r"^Would reformat: (.+)$", line)
        if m:
            out.append(Finding("format", m.group(1).strip(), "not `ruff format` clean (upstream's style)"))
    if fmt.returncode == 1 and not any(f.check == "format" for f in out):
        raise ToolError(
            f"ruff format --check failed without naming a file: {(fmt.stdout + fmt.stderr).strip()[:500]}"
        )
    iso = subprocess.run([ruff, *RUFF_ISORT, *files], cwd=tree, capture_output=True, text=True, check=False)
    if iso.returncode not in (0, 1):
        raise ToolError(f"ruff check --select I failed: {(iso.stderr or iso.stdout).strip()[:500]}")
    for line in iso.stdout.splitlines():
        m = re.match(r"^(.+?):(\d+):\d+: (I\d+) (.*)$", line)
        if m:
            out.append(Finding("isort", f"{m.group(1)}:{m.group(2)}", f"{m.group(3)} {m.group(4)}"))
    return out


# --------------------------------------------------------------------------- the whole lint


@dataclass(frozen=True)
class Applied:
    repo: Path
    base: str
    commits: tuple[str, ...]  # one per patch, in series order


def applied(t: Target) -> Applied:
    """The applied tree at the current series, or a ToolError saying how to get it."""
    repo = t.upstream_dir
    how = "run `nox -s apply` first (CI runs `nox -s apply build` before `nox -s lint`)"
    if t.carried:
        how = f"run `nox -s apply -- --upstream {t.version}` first"
    what = "the upstream-format lint reads the applied tree"
    if not gitutil.is_repo(repo):
        raise ToolError(f"{what}, and {repo} is not set up: {how}")
    base = gitutil.git(["rev-parse", "--verify", "-q", upstream.BASE_REF], repo, check=False)
    if base.returncode != 0:
        raise ToolError(f"{what}, and {repo} has no recorded base: {how}")
    state = upstream.read_state(repo)
    if state.get("series_hash") != series.series_hash(t.series_dir):
        raise ToolError(
            f"{what}, and {repo.name} is not applied at the current series (it changed since): {how}"
        )
    base_id = base.stdout.decode().strip()
    commits = tuple(gitutil.out(["rev-list", "--reverse", f"{base_id}..HEAD"], repo).split())
    wanted = len(series.read_order(t.series_dir))
    if len(commits) != wanted:
        raise ToolError(
            f"{what}, and {repo.name} holds {len(commits)} patch commits, the series {wanted}: {how}"
        )
    return Applied(repo, base_id, commits)


def upstream_bound(t: Target, report: Report) -> list[str]:
    """The upstream-bound patches: from the PR map, else (map refused) every patch not marked not-needed."""
    order = series.read_order(t.series_dir)
    prmap, problems = prs.fits(t)
    if prmap is not None:
        return prmap.upstream_bound
    for p in problems:
        report.findings.append(Finding("map", prs.PRS_FILE, p))
    fwd = prs.forwarded_of(t.series_dir, order)
    return [n for n in order if fwd.get(n) != prs.NOT_NEEDED]


def touched_python(app: Applied) -> list[str]:
    names = gitutil.out(
        ["diff", "--name-only", "--no-renames", "--diff-filter=AM", app.base, "HEAD"], app.repo
    )
    return sorted(n for n in names.splitlines() if n.endswith(".py") and (app.repo / n).is_file())


def check_tests(t: Target, app: Applied, bound: list[str], ci: ModuleType) -> list[Finding]:
    order = series.read_order(t.series_dir)
    # Test files as the last upstream-bound patch leaves them (a local patch after it may edit them).
    last = max((order.index(n) for n in bound), default=-1)
    at = app.commits[last] if last >= 0 else app.base
    out: list[Finding] = []
    for name in bound:
        info = series.parse_patch(t.series_dir / name)
        added = [f for f in info.new_files if is_registered_test(f)]
        if not added:
            out.append(
                Finding("tests", name, f"adds no test under {REGISTERED} (upstream's registered layout)")
            )
        for path in added:
            shown = gitutil.git(["show", f"{at}:{path}"], app.repo, check=False)
            if shown.returncode != 0:
                out.append(
                    Finding("tests", f"{name}: {path}", "not in the tree at the last upstream-bound patch")
                )
                continue
            for problem in test_problems(
                parse_test(ci, shown.stdout.decode("utf-8", errors="replace"), path)
            ):
                out.append(Finding("tests", f"{name}: {path}", problem))
    return out


def run(t: Target, ruff: str | None = None) -> Report:
    report = Report()
    app = applied(t)
    bound = upstream_bound(t, report)
    files = touched_python(app)
    exe = find_ruff(ruff)
    version = ruff_version(exe)
    if version != RUFF_VERSION:
        report.notes.append(f"ruff {version} (the lint session pins {RUFF_VERSION})")
    report.findings += ruff_findings(app.repo, files, exe)
    report.notes.append(
        f"ruff format + isort (upstream's settings) over {len(files)} Python file(s) the series touches"
    )
    for name in bound:
        report.findings += scan_patch(name, (t.series_dir / name).read_bytes())
    report.notes.append(f"added lines of {len(bound)} upstream-bound patch(es) scanned")
    report.findings += check_tests(t, app, bound, load_ci_register(app.repo))
    return report


if __name__ == "__main__":  # what `nox -s lint` runs, in the venv that holds ruff
    from bf16k.cli import upstream_lint_main

    sys.exit(upstream_lint_main())
