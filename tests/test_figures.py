"""Every figure block in README.md and the results READMEs is what its committed artifact says."""

from __future__ import annotations

import shutil
from pathlib import Path

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
    assert figures.check(tmp_path) == []
    doc = tmp_path / figures.H200 / "README.md"
    text = doc.read_text()
    doc.write_text(text.replace("| sm120 | fp8/fused | 57/57 |", "| sm120 | fp8/fused | 56/57 |", 1))
    assert any("'forward' differs" in p for p in figures.check(tmp_path))
    doc.write_text(text)
    shutil.rmtree(tmp_path / figures.H200 / "diagnose")
    problems = figures.check(tmp_path)
    assert any("'diagnosis' differs" in p for p in problems)
    rendered, _ = figures.render(text, tmp_path)
    assert "Not measured yet" in rendered
