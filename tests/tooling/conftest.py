"""Fixtures: a real product repository around the real pinned upstream (from the PyPI wheel)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bf16k import gitutil, patches, upstream
from bf16k import pin as pinmod
from bf16k.carried import Verified
from bf16k.carry import releases
from bf16k.carry.messages import Outcome
from bf16k.carry.state import Carry
from bf16k.project import SUBMODULE_PATH, Target

REPO_ROOT = Path(__file__).resolve().parents[2]
INDEXER = "python/sglang/srt/layers/attention/dsv4/indexer.py"
POOL = "python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py"


@pytest.fixture(scope="session")
def real_pin() -> pinmod.Pin:
    return pinmod.load(REPO_ROOT / "pin.toml")


@pytest.fixture(scope="session")
def wheel_path(real_pin: pinmod.Pin) -> Path:
    """The real pinned wheel (downloaded once into the bf16k cache, sha256-checked)."""
    return upstream.fetch_wheel(real_pin)


@pytest.fixture(scope="session")
def base_repo(tmp_path_factory: pytest.TempPathFactory, wheel_path: Path, real_pin: pinmod.Pin) -> Path:
    repo = tmp_path_factory.mktemp("base") / "upstream"
    upstream.materialize_wheel(wheel_path, repo, real_pin)
    return repo


@dataclass
class Product:
    root: Path
    target: Target

    @property
    def upstream(self) -> Path:
        return self.root / SUBMODULE_PATH

    def commit_patch(
        self, path: str, old: str | None, new: str, subject: str, body: str, trailers: str
    ) -> None:
        """Edit (or create, old=None) one upstream file and commit it as a patch commit."""
        f = self.upstream / path
        if old is None:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(new)
        else:
            text = f.read_text()
            assert old in text, f"{old!r} not in {path}"
            f.write_text(text.replace(old, new, 1))
        gitutil.git(["add", "--", path], self.upstream)
        msg = f"{subject}\n\n{body}\n\n{trailers}\n"
        env = {
            "GIT_AUTHOR_NAME": "Test Author",
            "GIT_AUTHOR_EMAIL": "author@example.com",
            "GIT_AUTHOR_DATE": "1700000000 +0000",
            "GIT_COMMITTER_DATE": "1700000000 +0000",
        }
        gitutil.git(["commit", "-q", "-m", msg], self.upstream, env=env)


WHY = (
    "The fp8 index keys of the C4 indexer lose needle recall beyond a few thousand tokens, "
    "so this change is needed to test the tooling on a real upstream file."
)
TRAILERS = "Forwarded: no\nLast-Update: 2026-11-29"


def make_product(root: Path, base_repo: Path, real_pin: pinmod.Pin) -> Product:
    """A product repo at ``root`` (pin, empty series, committed gitlink) with upstream already
    built from the wheel and the (empty) series applied."""
    (root / "series").mkdir(parents=True)
    (root / "series" / "series").write_text("")
    pin = pinmod.Pin(
        real_pin.version,
        real_pin.tag,
        real_pin.commit,
        real_pin.repository,
        pinmod.WheelPin(real_pin.wheel.filename, real_pin.wheel.sha256, real_pin.wheel.base_commit),
    )
    pinmod.save(pin, root / "pin.toml")
    (root / ".gitmodules").write_text(
        f'[submodule "{SUBMODULE_PATH}"]\n\tpath = {SUBMODULE_PATH}\n\turl = {pin.repository}\n'
    )
    gitutil.git(["init", "-q"], root)
    gitutil.git(["update-index", "--add", "--cacheinfo", f"160000,{pin.commit},{SUBMODULE_PATH}"], root)
    gitutil.git(["add", "pin.toml", "series", ".gitmodules"], root)
    gitutil.git(["commit", "-q", "-m", "product"], root)
    up = root / SUBMODULE_PATH
    gitutil.git(["clone", "-q", "--shared", str(base_repo), str(up)], root)
    base = gitutil.rev_parse(base_repo, "refs/heads/upstream-base")
    gitutil.git(["branch", "-q", "-f", "upstream-base", base], up)
    upstream.write_state(up, {"source": "wheel", "base": base, "version": pin.version})
    prod = Product(root, Target(root, None))
    patches.apply(prod.target)
    return prod


@pytest.fixture
def product(tmp_path: Path, base_repo: Path, real_pin: pinmod.Pin) -> Iterator[Product]:
    """A product repo (pin, empty series, committed gitlink) with upstream already built from the wheel."""
    root = tmp_path / "product"
    yield make_product(root, base_repo, real_pin)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def two_patch_product(product: Product) -> Product:
    """The product with a two-patch series (one edit of a real upstream file, one new file), exported."""
    product.commit_patch(
        INDEXER,
        "FP8_DTYPE = ",
        "# bf16k test: marker line\nFP8_DTYPE = ",
        "[DSV4] indexer: add a marker line",
        WHY,
        TRAILERS,
    )
    product.commit_patch(
        "python/sglang/srt/layers/attention/dsv4/bf16k_probe.py",
        None,
        '"""probe module"""\nVALUE = 1\n',
        "[DSV4] add a probe module",
        WHY,
        TRAILERS,
    )
    patches.export(product.target)
    return product


def scratch_repo(tmp_path: Path) -> Path:
    """An empty git repository in ``tmp_path/r``."""
    repo = tmp_path / "r"
    repo.mkdir()
    gitutil.git(["init", "-q"], repo)
    return repo


def commit_files(repo: Path, files: dict[str, str], message: str) -> str:
    """Write ``files`` (path -> text) into ``repo``, commit everything with ``message``; the commit id."""
    for path, text in files.items():
        (repo / path).write_text(text)
    gitutil.git(["add", "-A"], repo)
    gitutil.git(["commit", "-q", "-m", message], repo)
    return gitutil.rev_parse(repo, "HEAD")


def break_first_patch(series_dir: Path) -> str:
    """Change a context line of the series' first patch to one upstream never had, so the patch
    no longer applies there; the patch's name."""
    from bf16k import series

    name = series.read_order(series_dir)[0]
    path = series_dir / name
    path.write_bytes(path.read_bytes().replace(b"\n FP8_DTYPE = ", b"\n FP8_DTYPE_RENAMED = ", 1))
    return name


@pytest.fixture(scope="session")
def wheel_523(real_pin: pinmod.Pin) -> Path:
    wheel = releases.release_wheel("0.5.23", real_pin)
    assert releases.wheel_has_dsv4(wheel)
    return wheel


@dataclass
class RecordingGate:
    """A carry's test gate that records the release it was asked about and passes."""

    versions: list[str] = field(default_factory=list)

    def __call__(self, carry: Carry) -> Outcome | None:
        self.versions.append(carry.state.version)
        carry.state.verified = Verified("not run here", 0, "", 0)
        return None


@pytest.fixture
def no_gate() -> RecordingGate:
    """The carry's test gate, recorded instead of run (handed to the carry as `_cli(..., gate=)`),
    for the tests about carrying itself (conflicts, replay, the pin, range-diff): their series has
    no tests and touches the indexer module, which the gate's bisect would import at every prefix
    (~20 s each) for nothing they look at. The gate runs for real in test_carry.py."""
    return RecordingGate()
