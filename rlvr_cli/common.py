"""Small pieces every `rlvr` sub-command uses: fail with one line, parse `--set k=v`, print a table.

A leaf module: the other command modules import it; it imports none of them.
"""

from __future__ import annotations

from typing import Any

import typer
import yaml


def fail(message: str, code: int = 2) -> None:
    typer.echo(message, err=True)
    raise typer.Exit(code)


def parse_sets(sets: list[str]) -> dict[str, Any]:
    """`--set grpo.lr=1e-5` → {"grpo.lr": 1e-5}; values are parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for s in sets:
        if "=" not in s:
            fail(f"--set {s!r}: expected KEY=VALUE, e.g. --set eval.max_problems=50")
        k, v = s.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


def cell_text(v: Any) -> str:
    """A table cell: floats (also inside lists) to 4 significant digits, not 17 (`--json` keeps every digit)."""
    if v is None:
        return ""
    if isinstance(v, float):
        return format(v, ".4g")
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(cell_text(x) for x in v) + "]"
    return str(v)


def print_table(cols: list[str], rows: list[tuple]) -> None:
    cells = [[cell_text(v)[:60] for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    typer.echo("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    typer.echo("  ".join("-" * w for w in widths))
    for r in cells:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    typer.echo(f"({len(rows)} rows)", err=True)
