"""Canned warehouse queries: the SQL files in `dashboards/queries/`, shared by the CLI, the dashboard,
the static report and the tests, so every view runs exactly the SQL that is tested.

A query file starts with a comment header: free text saying what it answers, then one line per named
parameter (DuckDB's `$name` syntax in the body):

    -- param NAME: TYPE [= DEFAULT] | what it means

TYPE is text, int, float, bool or list (a comma-separated list of text); a parameter without a default
is required; `= NULL` makes NULL the default (the SQL then reads it as "no filter"). Every parameter the
header declares must appear in the body and every `$name` in the body must be declared, which
`load` checks, naming the file and line.

    run("per_problem_diff", {"run_a": "r1", "run_b": "r2"})      -> (columns, rows)
    rlvr warehouse query --canned per_problem_diff --param run_a=r1 --param run_b=r2
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr_core.records import warehouse

# The SQL lives beside the app that shows it (DESIGN.md: dashboards/ holds the app and its SQL);
# RLVR_QUERIES_DIR points elsewhere, e.g. for an installed package without the repository.
QUERIES_DIR = Path(os.environ.get("RLVR_QUERIES_DIR", Path(__file__).resolve().parents[2] / "dashboards" / "queries"))
TYPES = ("text", "int", "float", "bool", "list")
_PARAM_LINE = re.compile(r"^param\s+(?P<name>[A-Za-z_]\w*)\s*:\s*(?P<type>\w+)\s*(?:=\s*(?P<default>[^|]*?))?\s*"
                         r"(?:\|\s*(?P<help>.*))?$")
_PLACEHOLDER = re.compile(r"\$([A-Za-z_]\w*)")
_REQUIRED = object()


class QueryError(ValueError):
    """A canned query that does not exist, is malformed, or got a bad parameter (message says which)."""


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    default: Any  # _REQUIRED when there is none
    help: str = ""

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


@dataclass(frozen=True)
class CannedQuery:
    name: str
    path: Path
    description: str
    params: tuple[Param, ...]
    sql: str
    _by_name: dict[str, Param] = field(default_factory=dict, compare=False, repr=False)

    def bind(self, values: dict[str, Any] | None = None) -> dict[str, Any]:
        """Every declared parameter's value (given, else its default), converted to its type."""
        values = dict(values or {})
        unknown = sorted(set(values) - {p.name for p in self.params})
        if unknown:
            raise QueryError(f"{self.path}: no parameter {unknown[0]!r} (parameters: "
                             f"{', '.join(p.name for p in self.params) or 'none'})")
        out = {}
        for p in self.params:
            if p.name in values:
                out[p.name] = _convert(p, values[p.name], self.path)
            elif p.required:
                raise QueryError(f"{self.path}: parameter {p.name!r} ({p.type}) is required: {p.help}")
            else:
                out[p.name] = p.default
        return out


def _convert(p: Param, value: Any, where: Path | str) -> Any:
    """A value from Python or from the command line (a string) as the parameter's type; 'NULL' is None."""
    if value is None or (isinstance(value, str) and value.strip().upper() == "NULL"):
        return None
    try:
        if p.type == "list":
            items = value.split(",") if isinstance(value, str) else list(value)
            return [str(v).strip() for v in items if str(v).strip()]
        if p.type == "bool":
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("true", "1", "yes", "on"):
                return True
            if s in ("false", "0", "no", "off"):
                return False
            raise ValueError(f"{value!r} is not true/false")
        if p.type == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"{value!r} is not a whole number")
            return int(value)
        if p.type == "float":
            return float(value)
        return str(value)
    except (TypeError, ValueError) as e:
        raise QueryError(f"{where}: parameter {p.name!r} expects {p.type}: {e}") from None


def _parse(path: Path) -> CannedQuery:
    text = path.read_text()
    lines = text.splitlines()
    description, params = [], []
    body_start = len(lines)
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped.startswith("--"):
            body_start = i
            break
        content = stripped[2:].strip()
        if content.startswith("param"):
            m = _PARAM_LINE.match(content)
            if not m:
                raise QueryError(f"{path}:{i + 1}: bad parameter line {content!r} "
                                 "(expected 'param NAME: TYPE [= DEFAULT] | help')")
            if m["type"] not in TYPES:
                raise QueryError(f"{path}:{i + 1}: parameter {m['name']!r} has unknown type {m['type']!r} "
                                 f"(one of {', '.join(TYPES)})")
            p = Param(m["name"], m["type"], _REQUIRED, (m["help"] or "").strip())
            if m["default"] is not None:
                p = Param(p.name, p.type, _convert(p, m["default"], f"{path}:{i + 1}"), p.help)
            params.append(p)
        elif content:
            description.append(content)
    sql = "\n".join(lines[body_start:]).strip()
    if not sql:
        raise QueryError(f"{path}: no SQL after the comment header")
    # Placeholders in comments of the body would confuse this check; the body has none by convention.
    used = set(_PLACEHOLDER.findall(sql))
    declared = {p.name for p in params}
    for name in sorted(used - declared):
        line = next(i for i, ln in enumerate(lines) if f"${name}" in ln) + 1
        raise QueryError(f"{path}:{line}: ${name} is used but not declared in the header")
    for name in sorted(declared - used):
        raise QueryError(f"{path}: parameter {name!r} is declared but the SQL never uses ${name}")
    return CannedQuery(path.stem, path, " ".join(description), tuple(params), sql)


def list_queries(directory: Path | None = None) -> list[CannedQuery]:
    d = Path(directory or QUERIES_DIR)
    if not d.is_dir():
        raise QueryError(f"no canned queries folder at {d} (set RLVR_QUERIES_DIR)")
    return [_parse(p) for p in sorted(d.glob("*.sql"))]


def load(name: str, directory: Path | None = None) -> CannedQuery:
    d = Path(directory or QUERIES_DIR)
    path = d / f"{name}.sql"
    if not re.fullmatch(r"[A-Za-z0-9_]+", name) or not path.is_file():
        known = ", ".join(p.stem for p in sorted(d.glob("*.sql"))) if d.is_dir() else f"none: no folder {d}"
        raise QueryError(f"no canned query {name!r} (known: {known})")
    return _parse(path)


def run(name: str, params: dict[str, Any] | None = None, path: str | Path | None = None) -> tuple[list[str], list[tuple]]:
    """Run a canned query read-only against the warehouse at `path` (default: the configured one)."""
    q = load(name)
    return warehouse.query(q.sql, q.bind(params), path)


def records(name: str, params: dict[str, Any] | None = None, path: str | Path | None = None) -> list[dict[str, Any]]:
    """Rows as JSON-safe dicts."""
    q = load(name)
    return warehouse.query_records(q.sql, q.bind(params), path)


def frame(name: str, params: dict[str, Any] | None = None, path: str | Path | None = None):
    """Rows as a pandas DataFrame (for the dashboard and the report)."""
    import pandas as pd

    cols, rows = run(name, params, path)
    return pd.DataFrame.from_records(rows, columns=cols)


def parse_cli_params(items: list[str]) -> dict[str, str]:
    """`--param k=v` values → {k: v} (converted later, by the query's declared types)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise QueryError(f"--param {item!r}: expected NAME=VALUE, e.g. --param run_id=abc123")
        k, v = item.split("=", 1)
        out[k.strip()] = v
    return out


def describe(q: CannedQuery) -> str:
    """Help text for one query: what it answers and its parameters."""
    lines = [f"{q.name}: {q.description}"]
    for p in q.params:
        default = "required" if p.required else f"default {'NULL' if p.default is None else p.default}"
        lines.append(f"    --param {p.name}=<{p.type}>  ({default})  {p.help}")
    return "\n".join(lines)
