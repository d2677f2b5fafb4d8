"""`wheel`: the pinned upstream wheel with the applied series laid over it, installable with pip.

The series only changes files under ``python/sglang/**``, which is exactly the wheel's
``sglang/**``. So the patched wheel is the pinned wheel with the files the series changed replaced,
the files it adds added, the files it deletes dropped, and the metadata moved to a local version
``<upstream>+bf16k.<short series hash>`` (PEP 440): the dist-info directory, METADATA ``Version:``,
RECORD paths and the wheel file name all carry it. RECORD is rewritten (PEP 376/427: ``path,
sha256=<urlsafe base64, no padding>,size``; RECORD's own line has no hash). Upstream's tags
(Python, ABI, platform) are kept: the wheel holds upstream's compiled extensions unchanged.

The changes come from the upstream tree as ``apply`` left it (``refs/patches/upstream-head..HEAD``),
not from re-reading patch files, so the wheel holds exactly what `git am` produced. The output is
deterministic (fixed order, timestamps, permissions, compression), so one series gives one sha256.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from bf16k import gitutil, patches, series, upstream
from bf16k.errors import ToolError
from bf16k.pin import Pin
from bf16k.project import Target

LOCAL_TAG = "bf16k"
SHORT_HASH = 12  # hex digits of the series hash in the local version (as `apply` prints it)
TREE_PREFIX = "python/sglang/"  # where the package lives in the upstream tree
WHEEL_PREFIX = "sglang/"  # ... and in the wheel
# Zip stores local time without a zone; any fixed value makes the bytes reproducible. 2000-01-01
# matches the base commit's date (upstream.BASE_DATE).
ZIP_DATE = (2000, 1, 1, 0, 0, 0)
ZIP_LEVEL = 6  # zlib's default: the same level every run is what matters for byte identity
PROVENANCE_FILE = "bf16k.json"  # extra dist-info file: which series is installed (PEP 376 allows it)
GENERATOR = "bf16k wheel"


# --------------------------------------------------------------------------- the applied tree


@dataclass(frozen=True)
class AppliedTree:
    """The upstream tree of a target with the current series applied (and nothing else)."""

    repo: Path
    base: str  # refs/patches/upstream-head
    head: str
    series_hash: str
    names: list[str]
    source: str  # "wheel" or "submodule"


def _rev(repo: Path, ref: str) -> str:
    proc = gitutil.git(["rev-parse", "--verify", "-q", f"{ref}^{{commit}}"], repo, check=False)
    return proc.stdout.decode().strip() if proc.returncode == 0 else ""


def applied_tree(t: Target, action: str) -> AppliedTree:
    """The target's upstream tree, refusing unless it is the current series applied and clean.

    A wheel or a rewritten trailer built from anything else (an older series, local commits,
    uncommitted edits) would not be what `series/` says, so each condition stops with the step
    that fixes it.
    """
    repo = t.upstream_dir
    apply_cmd = "nox -s apply" + (f" -- --upstream {t.version}" if t.carried else "")
    if not gitutil.is_repo(repo):
        raise ToolError(f"{action}: {repo} is not set up; run `{apply_cmd}` first")
    if patches.am_in_progress(repo):
        raise ToolError(f"{action}: a `git am` is in progress in {repo}; finish or abort it first")
    base = _rev(repo, upstream.BASE_REF)
    if not base:
        raise ToolError(f"{action}: {repo} has no {upstream.BASE_REF}; run `{apply_cmd}` first")
    state = upstream.read_state(repo)
    current = series.series_hash(t.series_dir)
    head = _rev(repo, "HEAD")
    if state.get("series_hash") != current:
        applied = state.get("series_hash", "")[:SHORT_HASH] or "none"
        raise ToolError(
            f"{action}: {repo.name} is not applied at the current series hash "
            f"({current[:SHORT_HASH]}; applied: {applied}); run `{apply_cmd}` first"
        )
    if head != state.get("head"):
        raise ToolError(
            f"{action}: HEAD of {repo.name} ({head[:12]}) is not the commit the last apply/export "
            f"recorded ({state.get('head', '')[:12] or 'none'}): export your commits "
            f"(`nox -s export`) or re-apply (`{apply_cmd}`)"
        )
    dirty = gitutil.dirty_paths(repo)
    if dirty:
        raise ToolError(
            f"{action}: {repo.name} has uncommitted changes ({len(dirty)} path(s), e.g. {dirty[0][3:]}); "
            "commit and export them, or re-apply"
        )
    names = series.read_order(t.series_dir)
    count = len(gitutil.out(["rev-list", f"{base}..{head}"], repo).split())
    if count != len(names):
        raise ToolError(
            f"{action}: {repo.name} has {count} commit(s) on its base but the series lists "
            f"{len(names)}; re-apply with `{apply_cmd}`"
        )
    return AppliedTree(repo, base, head, current, names, state.get("source", "?"))


# --------------------------------------------------------------------------- what the series changes


@dataclass(frozen=True)
class Change:
    path: str  # inside the wheel: sglang/...
    status: str  # "A" added, "M" modified, "D" deleted
    data: bytes | None  # new content (None when deleted)
    executable: bool = False


def git_blob_id(data: bytes) -> str:
    """Git's id of a blob with these bytes: compares wheel files with tree files without git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _head_modes(repo: Path, head: str, paths: list[str]) -> dict[str, str]:
    if not paths:
        return {}
    text = gitutil.out(["ls-tree", "-r", "--full-tree", head, "--", *paths], repo)
    return {line.split("\t", 1)[1]: line.split()[0] for line in text.splitlines()}


def series_changes(tree: AppliedTree) -> list[Change]:
    """Every file the applied series adds, modifies or deletes, mapped to its wheel path."""
    # --no-renames: a rename is a delete plus an add in the wheel anyway.
    raw = gitutil.git(
        ["diff", "--name-status", "--no-renames", "-z", tree.base, tree.head], tree.repo
    ).stdout.decode()
    fields = [f for f in raw.split("\0") if f]
    # New tests and docs are upstream's, not the package's: the wheel leaves them out.
    pairs = [(s, p) for s, p in zip(fields[0::2], fields[1::2]) if not (s == "A" and series.outside_wheel(p))]
    outside = [p for _, p in pairs if not p.startswith(TREE_PREFIX)]
    if outside:
        raise ToolError(
            "the series changes files outside python/sglang/, which the wheel cannot carry: "
            + ", ".join(outside)
        )
    modes = _head_modes(tree.repo, tree.head, [p for s, p in pairs if s != "D"])
    changes = []
    for status, path in pairs:
        kind = status[0]
        if kind not in "AMDT":
            raise ToolError(f"unexpected change {status!r} of {path} in the series")
        wheel_path = WHEEL_PREFIX + path[len(TREE_PREFIX) :]
        if kind == "D":
            changes.append(Change(wheel_path, "D", None))
            continue
        mode = modes.get(path, "100644")
        if mode == "120000":
            raise ToolError(f"{path}: the series adds a symbolic link, which a wheel cannot hold")
        data = gitutil.git(["cat-file", "blob", f"{tree.head}:{path}"], tree.repo).stdout
        changes.append(Change(wheel_path, "M" if kind in "MT" else "A", data, mode == "100755"))
    return sorted(changes, key=lambda c: c.path)


# --------------------------------------------------------------------------- wheel metadata


def local_version(version: str, series_hash: str) -> str:
    """PEP 440 local version: `0.5.21` -> `0.5.21+bf16k.<12 hex>` (appended if one exists)."""
    tag = f"{LOCAL_TAG}.{series_hash[:SHORT_HASH]}"
    return f"{version}.{tag}" if "+" in version else f"{version}+{tag}"


def record_hash(data: bytes) -> str:
    """RECORD's hash field: `sha256=` + urlsafe base64 without padding (PEP 376/427)."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def wheel_filename(original: str, version: str) -> str:
    """The pinned wheel's file name with the version replaced; tags stay upstream's."""
    name, _, py, abi, plat = upstream._wheel_tags(original)
    # PEP 427 escapes '-' in the version as '_' (a local version has none, but stay correct).
    return f"{name}-{version.replace('-', '_')}-{py}-{abi}-{plat}.whl"


def _dist_info(names: list[str], filename: str) -> tuple[str, str]:
    """(dist-info folder, `.data` folder prefix) of the wheel, e.g. `sglang-0.5.21.dist-info/`."""
    tops = sorted({n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")})
    if len(tops) != 1:
        raise ToolError(f"{filename}: expected one .dist-info folder, found {tops or 'none'}")
    stem = tops[0][: -len(".dist-info")]
    return tops[0] + "/", stem + ".data/"


def rewrite_metadata(data: bytes, version: str) -> bytes:
    """METADATA with its `Version:` header set to ``version`` (headers end at the first blank line)."""
    text = data.decode("utf-8")
    head, sep, body = text.partition("\n\n")
    lines = head.split("\n")
    hits = [i for i, line in enumerate(lines) if line.startswith("Version:")]
    if len(hits) != 1:
        raise ToolError(f"METADATA has {len(hits)} 'Version:' headers, expected one")
    lines[hits[0]] = f"Version: {version}"
    return ("\n".join(lines) + sep + body).encode("utf-8")


def rewrite_wheel_file(data: bytes) -> bytes:
    """WHEEL with `Generator:` saying the tool repacked it (tags and purelib flag unchanged)."""
    out = []
    for line in data.decode("utf-8").splitlines():
        if line.startswith("Generator:"):
            line = f"Generator: {GENERATOR} (repacked from {line.split(':', 1)[1].strip()})"
        out.append(line)
    return ("\n".join(out) + "\n").encode("utf-8")


def provenance(pin: Pin, tree: AppliedTree, version: str, changes: list[Change]) -> bytes:
    """What is in this build: lets a deployment tell which series it runs (`importlib.metadata`)."""
    info = {
        "version": version,
        "upstream_version": pin.version,
        "upstream_wheel": pin.wheel.filename,
        "upstream_wheel_sha256": pin.wheel.sha256,
        "upstream_commit": pin.commit,
        "series_hash": tree.series_hash,
        "patches": tree.names,
        "base": tree.base,
        "head": tree.head,
        "changed": {c.path: c.status for c in changes},
    }
    return (json.dumps(info, indent=2, sort_keys=True) + "\n").encode()


def _zipinfo(name: str, executable: bool) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=ZIP_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3  # Unix, so the permission bits below are honoured by installers
    info.external_attr = (0o100755 if executable else 0o100644) << 16
    return info


def _record(rows: list[tuple[str, str, int]], record_path: str) -> bytes:
    """RECORD text; csv quoting keeps a path with a comma one field (lines end in \\n like pip's)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for name, hashed, size in rows:
        writer.writerow([name, hashed, str(size)])
    writer.writerow([record_path, "", ""])
    return buf.getvalue().encode()


# --------------------------------------------------------------------------- build


@dataclass
class BuiltWheel:
    path: Path
    sha256: str
    version: str
    changes: list[Change] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {k: sum(c.status == k for c in self.changes) for k in ("M", "A", "D")}


def _check_against_wheel(changes: list[Change], tree: AppliedTree, zf: zipfile.ZipFile) -> None:
    """Files the series modifies or deletes must be the wheel's files as the base holds them.

    The base may be the submodule (not built from this wheel); a file that differs there would
    make the wheel a mix of two upstreams, so stop instead.
    """
    present = set(zf.namelist())
    wrong = []
    for c in changes:
        tree_path = TREE_PREFIX + c.path[len(WHEEL_PREFIX) :]
        if c.status == "A":
            if c.path in present:
                wrong.append(f"{c.path}: the series creates it but the wheel already has it")
            continue
        if c.path not in present:
            wrong.append(f"{c.path}: the series changes it but the wheel does not hold it")
            continue
        base_blob = gitutil.out(["rev-parse", f"{tree.base}:{tree_path}"], tree.repo)
        if git_blob_id(zf.read(c.path)) != base_blob:
            wrong.append(
                f"{c.path}: the wheel's file differs from the base ({tree.source}) the series applies to"
            )
    if wrong:
        raise ToolError("the applied tree and the pinned wheel disagree:\n  " + "\n  ".join(wrong))


def build_wheel(t: Target, *, wheel_file: Path | None = None, out_dir: Path | None = None) -> BuiltWheel:
    """Write the patched wheel under ``out_dir`` (default build/wheel); return path and sha256."""
    pin = t.load_pin()
    tree = applied_tree(t, "wheel")
    changes = series_changes(tree)
    version = local_version(pin.version, tree.series_hash)
    source = upstream.fetch_wheel(pin, wheel_file)
    out_dir = (out_dir or t.build_dir / "wheel").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    target_path = out_dir / wheel_filename(pin.wheel.filename, version)
    # Written next to the target and renamed: a reader never sees half a wheel.
    tmp = target_path.with_name(target_path.name + f".tmp-{os.getpid()}")
    try:
        with zipfile.ZipFile(source) as zin, zipfile.ZipFile(tmp, "w") as zout:
            _check_against_wheel(changes, tree, zin)
            _repack(zin, zout, source.name, pin, tree, version, changes)
        tmp.replace(target_path)
    finally:
        tmp.unlink(missing_ok=True)
    problems = verify_record(target_path)
    if problems:  # a bug here, not bad input: never hand out a wheel pip would reject
        raise ToolError(f"{target_path.name}: RECORD does not verify:\n  " + "\n  ".join(problems[:10]))
    digest = upstream.sha256_file(target_path)
    # `sha256sum -c` format, for deployments that copy the wheel elsewhere.
    (target_path.parent / (target_path.name + ".sha256")).write_text(f"{digest}  {target_path.name}\n")
    return BuiltWheel(target_path, digest, version, changes)


def _repack(
    zin: zipfile.ZipFile,
    zout: zipfile.ZipFile,
    source_name: str,
    pin: Pin,
    tree: AppliedTree,
    version: str,
    changes: list[Change],
) -> None:
    """Stream the wheel's members into ``zout`` with the series' changes and the new metadata."""
    names = [i.filename for i in zin.infolist() if not i.is_dir()]  # folders are implied by paths
    old_info, old_data = _dist_info(names, source_name)
    new_info = f"{pin.wheel.filename.split('-')[0]}-{version}.dist-info/"
    new_data = new_info[: -len(".dist-info/")] + ".data/"
    by_path = {c.path: c for c in changes}
    deleted = {c.path for c in changes if c.status == "D"}
    added = {c.path for c in changes if c.status == "A"}
    # Package files sorted (new ones among them); dist-info last with RECORD at the very end, as
    # wheel builders lay it out.
    package = sorted(({n for n in names if not n.startswith(old_info)} - deleted) | added)
    recorded: list[tuple[str, str, int]] = []  # RECORD rows, hashed as written (no bytes kept)

    def put(name: str, data: bytes, executable: bool) -> None:
        zout.writestr(_zipinfo(name, executable), data, compresslevel=ZIP_LEVEL)
        recorded.append((name, record_hash(data), len(data)))

    for name in package:
        change = by_path.get(name)
        if change is not None and change.data is not None:
            put(_rename(name, old_data, new_data), change.data, change.executable)
        else:
            info = zin.getinfo(name)
            put(_rename(name, old_data, new_data), zin.read(info), bool((info.external_attr >> 16) & 0o111))
    meta = {new_info + n[len(old_info) :]: zin.read(n) for n in names if n.startswith(old_info)}
    meta.pop(new_info + "RECORD", None)
    meta[new_info + "METADATA"] = rewrite_metadata(meta[new_info + "METADATA"], version)
    meta[new_info + "WHEEL"] = rewrite_wheel_file(meta[new_info + "WHEEL"])
    meta[new_info + PROVENANCE_FILE] = provenance(pin, tree, version, changes)
    for name in sorted(meta):
        put(name, meta[name], False)
    record_path = new_info + "RECORD"
    zout.writestr(_zipinfo(record_path, False), _record(recorded, record_path), compresslevel=ZIP_LEVEL)


def _rename(name: str, old_data: str, new_data: str) -> str:
    """Move a `<name>-<version>.data/` entry to the new version's folder (PEP 427)."""
    return new_data + name[len(old_data) :] if name.startswith(old_data) else name


def verify_record(path: Path) -> list[str]:
    """Problems with a wheel's RECORD: a hash or size that does not match, a file not listed."""
    problems: list[str] = []
    with zipfile.ZipFile(path) as zf:
        files = [i.filename for i in zf.infolist() if not i.is_dir()]
        records = [n for n in files if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
        if len(records) != 1:
            return [f"expected one top-level .dist-info/RECORD, found {records or 'none'}"]
        rows = list(csv.reader(io.StringIO(zf.read(records[0]).decode("utf-8"))))
        listed: set[str] = set()
        for row in rows:
            if not row:
                continue
            if len(row) != 3:
                problems.append(f"RECORD line {row!r} does not have 3 fields")
                continue
            name, hashed, size = row
            if name in listed:
                problems.append(f"{name}: listed twice in RECORD")
            listed.add(name)
            if name == records[0]:
                if hashed or size:
                    problems.append("RECORD's own line must have no hash and no size")
                continue
            if name not in files:
                problems.append(f"{name}: in RECORD but not in the wheel")
                continue
            data = zf.read(name)
            if hashed != record_hash(data):
                problems.append(f"{name}: hash {hashed} != {record_hash(data)}")
            if size != str(len(data)):
                problems.append(f"{name}: size {size} != {len(data)}")
        for name in files:
            if name not in listed:
                problems.append(f"{name}: in the wheel but not in RECORD")
    return problems


# --------------------------------------------------------------------------- CLI
