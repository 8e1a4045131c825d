"""docs/guards.md against the code: every guard id has a row, each row's code paths and the names it gives
with them exist, each test file its status cites exists and mentions the guard, and the run summary's guard
coverage lists exactly the table's ids. Structure only, never wording, so a row can be reworded freely."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlvr_core.experiment.guard_coverage import GUARDS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "guards.md"
BUGZOO = ROOT.parent / "shared" / "BUGZOO.md"  # the list every guard answers (outside the repository)
CODE = re.compile(r"^(?:rlvr_core|tasks|flows|tests)/[\w/]+\.py$")
TEST = re.compile(r"\btests/[\w/]+\.py\b")
NAME = re.compile(r"^[A-Za-z_][\w.]*")


def _rows(text: str) -> list[list[str]]:
    """The guard table's rows, one list of cells each (id, what goes wrong, the guard, status)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("| G-"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows.append(cells)
    return rows


ROWS = _rows(DOC.read_text())
BY_ID = {r[0]: r for r in ROWS}


def _ticks(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _named_with_files(cell: str) -> list[tuple[str, str]]:
    """(file, name) for every backticked name that directly follows a backticked code path in the cell,
    e.g. "`rlvr_core/grpo/update.py` `check_logprob_temp`" or "`tasks/retry.py`: ... (`is_oom`)" is not one."""
    out = []
    for path, name in re.findall(r"`([^`]+\.py)`\s+`([^`]+)`", cell):
        m = NAME.match(name)
        if CODE.match(path) and m:
            out.append((path, m.group(0)))
    return out


def test_one_row_per_guard_with_four_cells_and_a_status():
    ids = [r[0] for r in ROWS]
    assert len(ids) == len(set(ids)), f"repeated ids: {sorted(i for i in ids if ids.count(i) > 1)}"
    for r in ROWS:
        assert len(r) == 4, f"{r[0]}: {len(r)} cells, expected 4 (id, what goes wrong, guard, status)"
        assert r[3].startswith(("done", "partial")), f"{r[0]}: status must start with done or partial"


def test_every_bugzoo_guard_has_a_row():
    if not BUGZOO.is_file():
        pytest.skip(f"{BUGZOO} not found")
    zoo = [r[0] for r in _rows(BUGZOO.read_text())]
    assert zoo and not set(zoo) - set(BY_ID), f"BUGZOO ids without a row: {sorted(set(zoo) - set(BY_ID))}"


def test_summary_guard_coverage_lists_exactly_the_doc_ids():
    assert list(GUARDS) == [r[0] for r in ROWS]


@pytest.mark.parametrize("gid", list(BY_ID))
def test_code_paths_and_names_in_the_row_exist(gid):
    guard = BY_ID[gid][2]
    paths = [t for t in _ticks(guard) if CODE.match(t)]
    assert paths, f"{gid}: the guard cell names no code path"
    missing = [p for p in paths if not (ROOT / p).is_file()]
    assert not missing, f"{gid}: no such file {missing}"
    for path, name in _named_with_files(guard):
        text = (ROOT / path).read_text()
        parts = name.split(".")
        assert any(re.search(rf"\b{re.escape(p)}\b", text) for p in parts), f"{gid}: `{name}` not in {path}"


@pytest.mark.parametrize("gid", list(BY_ID))
def test_test_files_in_the_status_exist_and_mention_the_guard(gid):
    _, _, guard, status = BY_ID[gid]
    names = {NAME.match(t).group(0).split(".")[-1] for t in _ticks(guard) if NAME.match(t) and not CODE.match(t)}
    names.discard("")
    files = sorted(set(TEST.findall(status)))
    if status.startswith("done"):
        assert files, f"{gid}: 'done' names no test file"
    for f in files:
        p = ROOT / f
        assert p.is_file(), f"{gid}: no such test file {f}"
        text = p.read_text()
        assert gid in text or any(re.search(rf"\b{re.escape(n)}\b", text) for n in names), \
            f"{gid}: {f} mentions neither the id nor a name from the row ({sorted(names)[:8]})"
