"""`wheel`: the pinned upstream wheel with a fixture series laid over it, installed with pip.

The fixture series edits a real upstream file (a marker in ``server_args.py``, which imports on a
CPU machine), adds a module and deletes a file. The wheel is built once per module (it repacks
the real 28 MB wheel) and installed once into a fresh venv (``python -m venv``, no network).
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from bf16k import cli, gitutil, patches, series, upstream, wheel
from bf16k import pin as pinmod
from bf16k.errors import ToolError
from bf16k.project import SUBMODULE_PATH, Target

from .conftest import POOL, REPO_ROOT, TRAILERS, WHY, Product, make_product

SERVER_ARGS = "python/sglang/srt/server_args.py"
PROBE = "python/sglang/srt/bf16k_wheel_probe.py"
DELETED = "python/sglang/README.md"
MARKER = "bf16k-wheel-fixture-marker"
ENV = {
    "GIT_AUTHOR_NAME": "Test Author",
    "GIT_AUTHOR_EMAIL": "author@example.com",
    "GIT_AUTHOR_DATE": "1700000000 +0000",
    "GIT_COMMITTER_DATE": "1700000000 +0000",
}


def _delete_patch(p: Product, path: str, subject: str) -> None:
    gitutil.git(["rm", "-q", "--", path], p.upstream)
    gitutil.git(["commit", "-q", "-m", f"{subject}\n\n{WHY}\n\n{TRAILERS}\n"], p.upstream, env=ENV)


@dataclass
class Built:
    product: Product
    first: wheel.BuiltWheel
    second_sha256: str
    venv: Path
    site: Path


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory, base_repo: Path, real_pin: pinmod.Pin, wheel_path: Path
) -> Built:
    root = tmp_path_factory.mktemp("wheel") / "product"
    p = make_product(root, base_repo, real_pin)
    p.commit_patch(
        SERVER_ARGS,
        "logger = logging.getLogger(__name__)\n",
        f'logger = logging.getLogger(__name__)\nBF16K_WHEEL_MARKER = "{MARKER}"\n',
        "[DSV4] server args: add a fixture marker",
        WHY,
        TRAILERS,
    )
    p.commit_patch(
        PROBE,
        None,
        '"""Fixture module the series adds."""\nVALUE = 42\n',
        "[DSV4] add a probe module",
        WHY,
        TRAILERS,
    )
    _delete_patch(p, DELETED, "[DSV4] drop the package README")
    patches.export(p.target)
    first = wheel.build_wheel(p.target)
    data = first.path.read_bytes()
    second = wheel.build_wheel(p.target)
    assert second.path == first.path
    env_dir = tmp_path_factory.mktemp("venv") / "venv"
    site = _install(env_dir, first.path)
    assert upstream.sha256_file(first.path) == first.sha256 and data == first.path.read_bytes()
    return Built(p, first, second.sha256, env_dir, site)


def _install(env_dir: Path, whl: Path) -> Path:
    """A fresh venv with the wheel pip-installed (no deps, no index: nothing from the network)."""
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    py = env_dir / "bin" / "python"
    proc = subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--no-compile",
            "--disable-pip-version-check",
            "-q",
            str(whl),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Root-Is-Purelib is false for sglang: pip puts it in platlib, the same folder in a venv.
    return Path(site)


def _run_in_site(site: Path, code: str) -> subprocess.CompletedProcess[str]:
    """Run code with the fresh venv's site-packages ahead of this environment's (torch etc.)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=site, check=False
    )


def _tree_files(repo: Path, rev: str) -> dict[str, str]:
    """Blob id of every file under python/sglang/ at rev, keyed by its wheel path."""
    text = gitutil.out(["ls-tree", "-r", "--full-tree", rev, "--", "python/sglang/"], repo)
    out = {}
    for line in text.splitlines():
        meta, path = line.split("\t", 1)
        out["sglang/" + path[len("python/sglang/") :]] = meta.split()[2]
    return out


# --------------------------------------------------------------------------- the wheel file


def test_record_verifies_every_hash_and_size(built: Built) -> None:
    assert wheel.verify_record(built.first.path) == []
    with zipfile.ZipFile(built.first.path) as zf:
        info = f"sglang-{built.first.version}.dist-info/"
        rows = list(csv.reader(io.StringIO(zf.read(info + "RECORD").decode())))
        files = [i.filename for i in zf.infolist() if not i.is_dir()]
        assert sorted(r[0] for r in rows) == sorted(files)  # every file listed once, nothing else
        for name, hashed, size in rows:
            if name == info + "RECORD":
                assert (hashed, size) == ("", "")
                continue
            data = zf.read(name)
            assert hashed.startswith("sha256=") and "=" not in hashed[len("sha256=") :]
            assert hashed == wheel.record_hash(data) and int(size) == len(data), name
        assert files[-1] == info + "RECORD"


def test_version_and_file_name_carry_the_series_hash(built: Built) -> None:
    p = built.product
    shash = series.series_hash(p.target.series_dir)
    version = f"0.5.21+bf16k.{shash[:12]}"
    assert built.first.version == version
    assert built.first.path.name == f"sglang-{version}-cp311-cp311-manylinux_2_34_x86_64.whl"
    assert built.first.path.parent == p.root / "build" / "wheel"
    sidecar = built.first.path.with_name(built.first.path.name + ".sha256").read_text()
    assert sidecar == f"{built.first.sha256}  {built.first.path.name}\n"
    with zipfile.ZipFile(built.first.path) as zf:
        tops = {n.split("/", 1)[0] for n in zf.namelist()}
        assert tops == {"sglang", f"sglang-{version}.dist-info"}
        info = f"sglang-{version}.dist-info/"
        metadata = zf.read(info + "METADATA").decode()
        assert f"\nVersion: {version}\n" in metadata and "\nVersion: 0.5.21\n" not in metadata
        wheel_meta = zf.read(info + "WHEEL").decode()
        assert (
            "Tag: cp311-cp311-manylinux_2_34_x86_64" in wheel_meta and "Root-Is-Purelib: false" in wheel_meta
        )
        prov = json.loads(zf.read(info + "bf16k.json"))
        assert (
            prov["series_hash"] == shash and prov["upstream_wheel_sha256"] == p.target.load_pin().wheel.sha256
        )
        assert prov["changed"] == {
            "sglang/README.md": "D",
            "sglang/srt/bf16k_wheel_probe.py": "A",
            "sglang/srt/server_args.py": "M",
        }
        # Fixed timestamps and Unix permissions on every member.
        assert {i.date_time for i in zf.infolist()} == {wheel.ZIP_DATE}
        assert {i.external_attr >> 16 for i in zf.infolist()} <= {0o100644, 0o100755}


def test_wheel_holds_exactly_the_patched_tree(built: Built) -> None:
    p = built.product
    expected = _tree_files(p.upstream, "HEAD")
    with zipfile.ZipFile(built.first.path) as zf:
        got = {
            n: wheel.git_blob_id(zf.read(n))
            for n in zf.namelist()
            if n.startswith("sglang/") and not n.endswith("/")
        }
    assert got == expected
    assert "sglang/README.md" not in got and "sglang/srt/bf16k_wheel_probe.py" in got


def test_two_builds_are_byte_identical(built: Built) -> None:
    assert built.second_sha256 == built.first.sha256


# --------------------------------------------------------------------------- installed with pip


def test_pip_installs_it_into_a_fresh_venv_with_the_patched_files(built: Built) -> None:
    expected = _tree_files(built.product.upstream, "HEAD")
    installed = {}
    for path in sorted((built.site / "sglang").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            installed["sglang/" + path.relative_to(built.site / "sglang").as_posix()] = wheel.git_blob_id(
                path.read_bytes()
            )
    assert installed == expected
    proc = subprocess.run(
        [
            str(built.venv / "bin" / "python"),
            "-c",
            "import importlib.metadata as m; d = m.distribution('sglang'); print(d.version); print(d.read_text('bf16k.json'))",
        ],
        capture_output=True,
        text=True,
        cwd=built.venv,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    version, _, prov = proc.stdout.partition("\n")
    assert version == built.first.version
    assert json.loads(prov)["patches"] == series.read_order(built.product.target.series_dir)


def test_installed_package_imports_with_the_series_changes(built: Built) -> None:
    code = (
        "import sglang, sglang.srt.server_args as sa, sglang.srt.bf16k_wheel_probe as probe\n"
        "print(sglang.__file__); print(sa.BF16K_WHEEL_MARKER); print(probe.VALUE)\n"
    )
    proc = _run_in_site(built.site, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    where, marker, value = proc.stdout.split()
    assert Path(where).is_relative_to(built.site)  # the installed copy, not another sglang
    assert (marker, value) == (MARKER, "42")


# --------------------------------------------------------------------------- refusals and CLI


def test_refuses_a_dirty_tree(built: Built) -> None:
    pool = built.product.upstream / POOL
    original = pool.read_bytes()
    try:
        pool.write_bytes(original + b"\n# edit\n")
        with pytest.raises(ToolError, match="uncommitted changes"):
            wheel.build_wheel(built.product.target, out_dir=built.venv.parent / "refused")
    finally:
        pool.write_bytes(original)
    assert not (built.venv.parent / "refused").exists()


def test_refuses_a_tree_not_applied_at_the_current_series(built: Built) -> None:
    d = built.product.target.series_dir
    name = series.read_order(d)[1]
    original = (d / name).read_bytes()
    try:
        (d / name).write_bytes(original.replace(b"VALUE = 42", b"VALUE = 43"))
        with pytest.raises(ToolError, match="not applied at the current series hash.*nox -s apply"):
            wheel.build_wheel(built.product.target, out_dir=built.venv.parent / "refused")
    finally:
        (d / name).write_bytes(original)
    assert not (built.venv.parent / "refused").exists()


def test_cli_prints_path_and_sha256(
    built: Built, wheel_path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert (
        cli.main(
            [
                "--root",
                str(built.product.root),
                "wheel",
                "--out",
                str(tmp_path),
                "--wheel-file",
                str(wheel_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    path = Path(out.split("wheel: ")[1].split("\n")[0])
    # Shown relative to the working folder when it lies inside (pytest's may: build/tmp/).
    assert Path.cwd() / path == tmp_path / built.first.path.name
    assert f"sha256: {built.first.sha256}" in out  # same series, other folder: same bytes
    assert "1 changed, 1 new, 1 deleted" in out


# --------------------------------------------------------------------------- the real series


def _real_series_state() -> str:
    """Empty when the real series is applied in sglang-upstream; else why the test must skip."""
    t = Target(REPO_ROOT, None)
    names = series.read_order(t.series_dir)
    if not names:
        return "the real series is not there yet (series/series lists no patches)"
    try:
        wheel.applied_tree(t, "wheel")
    except ToolError as exc:
        return f"the real series is not applied in sglang-upstream ({exc})"
    return ""


# feature: (text the applied tree must contain for the feature to be there, check of the installed wheel)
REAL_CHECKS = {
    "bf16-server-arg": (
        "deepseek-v4-indexer-k-dtype",
        (
            "import argparse, sglang.srt.server_args as sa\n"
            "p = argparse.ArgumentParser(); sa.ServerArgs.add_cli_args(p)\n"
            "a = p.parse_args(['--model-path', 'x', '--deepseek-v4-indexer-k-dtype', 'bf16'])\n"
            "assert a.deepseek_v4_indexer_k_dtype == 'bf16'\n"
        ),
    ),
    "bf16-bytes-per-token": (
        "index_k_format",
        (
            "import sglang.srt.mem_cache.deepseek_v4_memory_pool as pool\n"
            "assert pool.get_dsv4_indexer_bytes_per_token(128, index_k_format='bf16') == 256\n"
        ),
    ),
}
# Runs a check; an ImportError raised outside the installed sglang (a dependency this environment
# lacks, e.g. torchvision on a CPU machine) is reported as ENV-SKIP instead of a failure.
REAL_WRAPPER = """
import sys, traceback
site = sys.argv[1]
import sglang
assert sglang.__file__.startswith(site), sglang.__file__
try:
    exec(compile(sys.argv[2], "<check>", "exec"))
except ImportError as e:
    where = traceback.extract_tb(e.__traceback__)[-1].filename
    missing = isinstance(e, ModuleNotFoundError) and not (e.name or "").startswith("sglang")
    if missing or not where.startswith(site):
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"ENV-SKIP {type(e).__name__}: {first} ({where})")
        sys.exit(0)
    raise
print("ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize("feature", sorted(REAL_CHECKS))
def test_real_series_wheel_has_the_bf16_option(
    feature: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With the real series applied, the installed wheel has the bf16 option (patch 5) and the bf16
    bytes-per-key accounting (patch 1). Set PYTHONPATH to add a dependency shim (it goes after the
    wheel's site-packages)."""
    why = _real_series_state()
    if why:
        pytest.skip(why)
    needle, code = REAL_CHECKS[feature]
    tree = REPO_ROOT / SUBMODULE_PATH
    if gitutil.git(
        ["grep", "-q", "-F", needle, "HEAD", "--", "python/sglang/"], tree, check=False
    ).returncode:
        pytest.skip(f"the applied real series does not contain {needle!r} yet (its patch has not landed)")
    site = _real_site(tmp_path_factory)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-c", REAL_WRAPPER, str(site), code],
        capture_output=True,
        text=True,
        env=env,
        cwd=site,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    if proc.stdout.startswith("ENV-SKIP"):
        pytest.skip(f"this environment cannot import the module: {proc.stdout.strip()[len('ENV-SKIP ') :]}")
    assert proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr[-3000:]


_REAL_SITE: dict[str, Path] = {}


def _real_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the real series' wheel (into a temporary folder) and install it once per session."""
    if "site" not in _REAL_SITE:
        out = tmp_path_factory.mktemp("real-wheel")
        built = wheel.build_wheel(Target(REPO_ROOT, None), out_dir=out)
        assert wheel.verify_record(built.path) == []
        _REAL_SITE["site"] = _install(out / "venv", built.path)
    return _REAL_SITE["site"]
