"""What the carry tests share: the 0.5.23 release they carry to, the edits their small series
make, and the CLI as `python -m bf16k` runs it."""

from __future__ import annotations

import hashlib
import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from bf16k import cli
from bf16k.carry.gate import Gate

from .conftest import INDEXER, TRAILERS, WHY, Product

REL = "0.5.23"
COMPRESSOR_IMPORT = "    from sglang.srt.layers.attention.dsv4.compressor import ("
Q_SIGNATURE = """        weight: torch.Tensor,
    ) -> Tuple[IndexerQuery, torch.Tensor]:
        q, _ = self.wq_b(q_lora)
"""
# 0.5.23 made exactly this change (plus a comment line above the call): a backport.
Q_BACKPORT = """        weight: torch.Tensor,
        q_lora_quant=None,
    ) -> Tuple[IndexerQuery, torch.Tensor]:
        q, _ = self.wq_b(q_lora if q_lora_quant is None else q_lora_quant)
"""
# A change of the same line 0.5.23 changed differently: a real conflict.
Q_CONFLICT = """        weight: torch.Tensor,
    ) -> Tuple[IndexerQuery, torch.Tensor]:
        q, _ = self.wq_b(q_lora.contiguous())
"""
CONFLICT_NAME = "indexer-make-q-lora-contiguous.patch"


def _add(p: Product, path: str, old: str | None, new: str, subject: str) -> None:
    p.commit_patch(path, old, new, subject, WHY, TRAILERS)


def _context_only_patch(p: Product) -> None:
    # Inserted two lines above the import 0.5.23 renamed: its context changes, its +/- lines don't.
    _add(
        p,
        INDEXER,
        "if TYPE_CHECKING:\n",
        "if TYPE_CHECKING:\n    # bf16k test: context marker\n",
        "[DSV4] indexer: add a context marker",
    )


def _snapshot(root: Path) -> dict[str, bytes]:
    """series/, pin.toml and CHANGELOG.md as bytes (what a carry must not touch)."""
    files = {str(p.relative_to(root)): p.read_bytes() for p in (root / "series").rglob("*") if p.is_file()}
    for name in ("pin.toml", "CHANGELOG.md"):
        if (root / name).is_file():
            files[name] = (root / name).read_bytes()
    return files


def _tree_hash(root: Path) -> str:
    """Every path and byte under root, git internals included."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _cli(root: Path, *args: str, gate: Gate | None = None) -> tuple[int, str, str]:
    """The commands as `python -m bf16k` runs them: (exit status, stdout, stderr); ``gate`` stands in
    for the carry's test gate (default: the real one, as on the command line)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(["--root", str(root), *args], gate=gate)
    return code, out.getvalue(), err.getvalue()


def _carried_tree(root: Path) -> Path:
    return root / "build" / "upstream" / REL
