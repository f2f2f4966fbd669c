"""gpumem packages for side-by-side benchmarks: the working tree's, and a git revision's.

A revision's ``gpumem/`` comes from ``git archive``, which holds no build
outputs; its snapshot reader and analyses are native code (``gpumem._C``),
so a built extension is put beside it: the revision's own build when one is
given (``ext``), else the working tree's.  ``copy_working_tree`` makes a copy
of the working tree's package in the same shape, so that both sides run from
a scratch folder the same way.  ``byte_compile`` compiles a package's modules
ahead, as installing gpumem does; without it a process run with
PYTHONDONTWRITEBYTECODE compiles every module it imports, each time.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def revision_tree(rev: str, dest: Path, ext: Path | None = None) -> Path:
    """gpumem ``rev``'s package under dest (dest/gpumem), with a built ``_C``
    beside it: ``ext`` (the revision's own build), else the working tree's."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "gpumem"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    exts = [ext] if ext else sorted((ROOT / "gpumem").glob("_C.*.so"))
    if not exts:
        raise SystemExit("no built gpumem._C in the working tree: run pip install -e . first")
    for so in exts:
        shutil.copy(so, dest / "gpumem" / so.name)
    return dest


def copy_working_tree(dest: Path) -> Path:
    """The working tree's package, built extension included, under dest (dest/gpumem)."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "gpumem", dest / "gpumem",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def byte_compile(tree: Path) -> None:
    """Compile tree/gpumem's modules to bytecode, as an installed package has them."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "gpumem")],
                   check=True, capture_output=True)
