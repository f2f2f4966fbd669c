"""benchmarks/torch_matrix.py's table in docs/compatibility.md: rows of the
releases measured replace theirs, the others stay, in release order (no torch
needed; the measuring itself is the script's run, not in CI)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _matrix(doc: Path):
    spec = importlib.util.spec_from_file_location("torch_matrix", ROOT / "benchmarks" / "torch_matrix.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.DOC = doc
    return mod


def _rows(doc: Path) -> list[str]:
    return [line for line in doc.read_text().splitlines() if line.startswith("| 2.")]


def test_rows_merge_in_release_order(tmp_path):
    doc = tmp_path / "compatibility.md"
    m = _matrix(doc)
    doc.write_text(f"# t\n\n{m.BEGIN}\n{m.END}\n\nafter\n")
    m.write({"2.10.0+cu128": "| 2.10.0+cu128 | old |", "2.6.0+cu124": "| 2.6.0+cu124 | a |"})
    m.write({"2.10.0+cu128": "| 2.10.0+cu128 | new |", "2.13.0+cu130": "| 2.13.0+cu130 | b |"})
    assert _rows(doc) == ["| 2.6.0+cu124 | a |", "| 2.10.0+cu128 | new |", "| 2.13.0+cu130 | b |"]
    text = doc.read_text()
    assert text.count(m.HEADER) == 1 and text.endswith("\n\nafter\n")


def test_a_document_without_markers_is_refused(tmp_path):
    doc = tmp_path / "compatibility.md"
    doc.write_text("# no table here\n")
    with pytest.raises(SystemExit, match="markers"):
        _matrix(doc).write({"2.12.1+cu130": "| 2.12.1+cu130 | x |"})
    assert doc.read_text() == "# no table here\n"


def test_the_shipped_document_has_the_markers():
    m = _matrix(ROOT / "docs" / "compatibility.md")
    text = m.DOC.read_text(encoding="utf-8")
    assert text.index(m.BEGIN) < text.index(m.END)
