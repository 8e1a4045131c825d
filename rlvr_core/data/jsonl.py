"""JSON Lines in and out, with errors that name the file and line (bad data never fails anonymously)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Iterable, Iterator


class DataFormatError(ValueError):
    """A malformed data row; the message starts with `file:line:`."""


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(1-based line number, object) for each non-blank line; raises DataFormatError on a bad line.
    A ``.gz`` file is read through gzip (HumanEval ships gzipped)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise DataFormatError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


def read_jsonl(path: str | Path) -> list[dict]:
    return [obj for _, obj in iter_jsonl(path)]


def write_jsonl(rows: Iterable[dict], path: str | Path) -> Path:
    """Write via a temporary name and rename, so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path
