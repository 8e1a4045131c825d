"""Peers' own test suites as data: `make test` unpacks math-verify's source distribution (its tests/ folder holds the
regression suite, 270 gold/prediction/expected triples from model outputs) next to the virtual environment. The
triples are read with `ast.literal_eval`: nothing of the peer's test code runs. Tests skip, naming the path,
where the folder is absent ($RLVR_PEER_SRC overrides it)."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEER_SRC = Path(os.environ.get("RLVR_PEER_SRC", ROOT / ".venv" / "peer-src"))
MATH_VERIFY_TESTS = PEER_SRC / "math_verify-0.9.0" / "tests"


@dataclass(frozen=True)
class Triple:
    file: str
    test: str
    index: int
    gold: str
    pred: str
    expected: bool

    @property
    def key(self) -> str:
        return f"{self.file}::{self.test}[{self.index}]"


def math_verify_triples() -> list[Triple]:
    """Every literal (gold, pred, expected) row of a parametrized test in math-verify's tests/, except the rows of
    the one test that switches on a non-default comparison (allow_set_relation_comp)."""
    if not MATH_VERIFY_TESTS.is_dir():
        pytest.skip(f"math-verify's source distribution not unpacked at {MATH_VERIFY_TESTS} (make test does it)")
    out = []
    for path in sorted(MATH_VERIFY_TESTS.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                out += _rows(path.name, node)
    return out


def _rows(file: str, func: ast.FunctionDef) -> list[Triple]:
    out = []
    for deco in func.decorator_list:
        if not (isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "parametrize"):
            continue
        names = [n.strip() for n in ast.literal_eval(deco.args[0]).split(",")]
        if "gold" not in names or "pred" not in names or "allow_set_relation_comp" in names:
            continue
        try:
            rows = ast.literal_eval(deco.args[1])
        except ValueError:  # built with f-strings or calls: not data
            continue
        for i, values in enumerate(rows):
            row = dict(zip(names, values))
            expected = row.get("expected", row.get("result"))
            out.append(Triple(file, func.name, i, row["gold"], row["pred"], bool(expected)))
    return out
