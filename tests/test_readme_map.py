"""The README's map of the code (the layer table under "The library's layers") against the tree.

Every module in rlvr_core/, tasks/ and flows/ is named in the row of its folder, and every name in the table
exists, so the map neither misses a module nor names one that moved. A name is a module (`stats` for
rlvr_core/core/stats.py) or a package, which covers the modules under it (`benchmarks` for
rlvr_core/experiment/benchmarks/); `name/` names a folder and covers everything under it too. The
"Where things live" answers are checked too: every file they name exists and defines what they point at.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("rlvr_core", "tasks", "flows")


def _rows() -> list[tuple[list[str], list[str]]]:
    """(folders, names) per row of the layer table."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| layer | modules |"):].split("\n\n", 1)[0].splitlines()[2:]
    rows = []
    for line in table:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 2, f"README.md layer table: a row needs two cells: {line!r}"
        rows.append((re.findall(r"`([^`]+/)`", cells[0]), re.findall(r"`([^`]+)`", cells[1])))
    return rows


def _modules() -> list[Path]:
    return sorted(p.relative_to(ROOT) for f in FOLDERS for p in (ROOT / f).rglob("*.py")
                  if p.name != "__init__.py" and "__pycache__" not in p.parts)


def _covered(module: Path, folders: list[str], names: list[str]) -> bool:
    for folder in folders:
        rest = module.relative_to(folder) if module.is_relative_to(folder) else None
        if rest is None:
            continue
        first = rest.parts[0].removesuffix(".py")
        if first in names or (len(rest.parts) > 1 and f"{rest.parts[0]}/" in names):
            return True
    return False


def test_every_module_is_on_the_map():
    rows = _rows()
    missing = [str(m) for m in _modules() if not any(_covered(m, folders, names) for folders, names in rows)]
    assert not missing, ("modules the README layer table does not name (add each to its folder's row, or the "
                         f"folder as `name/`): {missing}")


def test_every_name_on_the_map_exists():
    wrong = []
    for folders, names in _rows():
        assert folders, "README.md layer table: a row without a folder"
        for folder in folders:
            assert (ROOT / folder).is_dir(), f"README.md layer table names {folder}, which is not a folder"
        for name in names:
            candidates = [ROOT / f / (name if name.endswith("/") else f"{name}.py") for f in folders]
            candidates += [ROOT / f / name for f in folders if not name.endswith("/")]  # a package
            if not any(c.exists() for c in candidates):
                wrong.append(f"`{name}` (in the row of {', '.join(folders)})")
    assert not wrong, f"README.md layer table names what does not exist: {wrong}"


def test_the_where_things_live_answers_name_what_exists():
    """Every `path.py` and `path.py:name` in the "Where things live" table exists (the name defined there)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Where things live"):]
    section = section.split("\n## ", 1)[0]
    wrong = []
    for ref in re.findall(r"`((?:rlvr_core|rlvr_cli|flows|tasks|benchmarks)/[\w/]+\.py)(?::(\w+))?`", section):
        path, name = ROOT / ref[0], ref[1]
        if not path.is_file():
            wrong.append(ref[0])
        elif name and not re.search(rf"^(?:def|class) {name}\b|^{name}\s*[:=]|^    def {name}\b|\b{name} = ",
                                    path.read_text(), re.M):
            wrong.append(f"{ref[0]}:{name}")
    assert not wrong, f'README.md "Where things live" names what does not exist: {wrong}'
