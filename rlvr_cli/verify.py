"""`rlvr verify`: verify a JSONL file of responses and write one outcome per line.

The lead registers `verify_command` as the `verify` sub-command of `rlvr_cli/main.py`; it is written
with typer annotations so typer builds the options from its signature.

Input lines carry `response` and the gold under the field that fits the verifier (read by
`rlvr_core/data/gold.py:line_gold`):
- most verifiers: `answer`;
- `ifeval`: `prompt`, `instruction_id_list`, `kwargs` (as in IFEval's input_data.jsonl);
- `code`: `tests` (a string of Python test code, or a list of assert lines).
Each output line is the input line plus `status`, `reward`, `extracted` and `detail`. A malformed
line stops the run with an error naming the file and line number: silently skipping lines would
change the denominator of every score computed from the output.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from rlvr_core.data.gold import line_gold
from rlvr_core.data.jsonl import DataFormatError, iter_jsonl
from rlvr_core.sandbox.host import SandboxUnavailable
from rlvr_core.verifiers.base import Status
from rlvr_core.verifiers.pool import VerifierPool
from rlvr_core.verifiers.registry import default_workers, get_verifier


class InputError(ValueError):
    """A malformed input line; the message names the file and the line number."""


def read_rows(path: Path, verifier: str) -> list[tuple[dict[str, Any], str, Any]]:
    """(row, response, gold) per non-empty line; raises InputError naming `path:line` on bad input."""
    out = []
    try:
        for lineno, row in iter_jsonl(path):
            try:
                response, gold = row["response"], line_gold(verifier, row)
            except KeyError as exc:
                raise InputError(f"{path}:{lineno}: missing field {exc.args[0]!r} for verifier {verifier!r}") from None
            if not isinstance(response, str):
                raise InputError(f"{path}:{lineno}: 'response' must be a string, got {type(response).__name__}")
            out.append((row, response, gold))
    except DataFormatError as exc:
        raise InputError(str(exc)) from None
    return out


def run_verify(
    verifier: str, input: Path, output: Path, mode: str | None = None, workers: int | None = None,
    timeout_s: float = 5.0, isolation: str | None = None,
) -> Counter[str]:
    """Library form of the command: returns the counts per status. workers None: the verifier's default;
    isolation (code only): `os` (the default) or `hook-only`."""
    options: dict[str, Any] = {"mode": mode} if mode is not None else {}
    if isolation is not None:
        if verifier != "code":
            raise ValueError(f"--isolation applies to the code verifier only, not {verifier!r}")
        options["isolation"] = isolation
    get_verifier(verifier, **options)  # fail fast on an unknown verifier or mode, before reading input
    workers = default_workers(verifier) if workers is None else workers
    rows = read_rows(input, verifier)
    with VerifierPool(verifier, options, workers=workers, timeout_s=timeout_s) as pool:
        outcomes = pool.verify_many([(r, g) for _, r, g in rows])
    counts: Counter[str] = Counter()
    output.parent.mkdir(parents=True, exist_ok=True)
    with Path(output).open("w", encoding="utf-8") as f:
        for (row, _, _), o in zip(rows, outcomes):
            counts[o.status.value] += 1
            out = dict(row, status=o.status.value, reward=o.reward, extracted=o.extracted, detail=o.detail)
            f.write(json.dumps(out, ensure_ascii=False) + "\n")
    return counts


def verify_command(
    verifier: Annotated[str, typer.Option("--verifier", help="registered name: gsm8k, math, minerva, mcq, ifeval, code")],
    input: Annotated[Path, typer.Option("--input", exists=True, dir_okay=False, help="input JSONL")],
    output: Annotated[Path, typer.Option("--output", dir_okay=False, help="output JSONL: input + status, reward, extracted")],
    mode: Annotated[Optional[str], typer.Option("--mode", help="gsm8k: flexible|strict; math: lenient|boxed")] = None,
    workers: Annotated[Optional[int], typer.Option(
        "--workers", help="worker processes; default per verifier: 0 (in-process, fastest) for gsm8k and mcq, which "
        "cannot hang, 2 for math, minerva, ifeval and code; 0 is refused for those")] = None,
    timeout_s: Annotated[float, typer.Option(
        "--timeout-s", help="per-item limit in the item's own time: CPU time plus time blocked, not time spent "
        "waiting for a busy CPU; a hang is killed shortly after it")] = 5.0,
    isolation: Annotated[Optional[str], typer.Option(
        "--isolation", help="code: how model-written programs are isolated; os (default: bubblewrap namespaces, "
        "refused where the host has none) or hook-only (the audit hook alone, an explicit opt-in)")] = None,
) -> None:
    """Verify responses in a JSONL file; print the counts per status."""
    try:
        counts = run_verify(verifier, input, output, mode=mode, workers=workers, timeout_s=timeout_s,
                            isolation=isolation)
    except (InputError, SandboxUnavailable) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    except (KeyError, ValueError, TypeError) as exc:  # unknown verifier, bad mode
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    total = sum(counts.values())
    typer.echo(f"{total} lines verified with {verifier!r} -> {output}")
    for status in Status:
        typer.echo(f"  {status.value:<10} {counts.get(status.value, 0)}")
