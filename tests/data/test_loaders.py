"""Loaders on the real sets in ../shared/data: one schema, stable unique ids, malformed rows named."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

from rlvr_core.data.loaders import (DataFormatError, known_datasets, last_boxed, load_hf_problems, load_jsonl_problems,
                                    load_problems, make_id, normalize_id)
from rlvr_core.experiment.benchmarks import data_root

DATA = data_root()  # $RLVR_DATA_DIR, else ../shared/data
pytestmark = pytest.mark.shared_data  # skipped where the data is absent (tests/conftest.py)

FILES = {"gsm8k": "test.jsonl", "math500": "test.jsonl", "minerva_math": "test.jsonl", "aime24": "test.jsonl",
         "amc23": "test.jsonl", "svamp": "test.jsonl", "asdiv": "test.jsonl", "aqua": "test.jsonl",
         "mmlu_stem": "test.jsonl", "ifeval": "input_data.jsonl"}


def raw_rows(name):
    return [json.loads(line) for line in (DATA / name / FILES[name]).read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", sorted(FILES))
def test_schema_ids_and_counts(name):
    assert name in known_datasets()
    problems = load_problems(name, DATA / name)  # folder -> the set's default file
    raw = raw_rows(name)
    assert len(problems) == len(raw)
    ids = [p["id"] for p in problems]
    assert len(set(ids)) == len(ids)
    assert all(i == normalize_id(i) and i.startswith(f"{name}/test/") for i in ids)
    for p in problems:
        assert set(p) == {"id", "question", "answer", "solution", "meta"}
        assert isinstance(p["question"], str) and p["question"].strip()
        assert isinstance(p["answer"], str) and (p["answer"] or name == "ifeval")
        assert p["solution"] is None or isinstance(p["solution"], str)
        assert isinstance(p["meta"]["line"], int)
    assert [p["id"] for p in load_problems(name, DATA / name / FILES[name])] == ids  # stable


def test_per_set_answers_against_the_raw_fields():
    gsm = load_problems("gsm8k", DATA / "gsm8k" / "test.jsonl")
    assert all(re.fullmatch(r"-?\d+", p["answer"]) for p in gsm)
    assert all(p["meta"]["answer_raw"].replace(",", "") == p["answer"] for p in gsm)
    assert all("<<" not in p["solution"] for p in gsm)
    assert len(load_problems("gsm8k", DATA / "gsm8k" / "train.jsonl")) == 7473

    for p, r in zip(load_problems("math500", DATA / "math500"), raw_rows("math500")):
        assert p["answer"] == r["answer"] and p["id"] == "math500/" + r["unique_id"].removesuffix(".json")
    for p, r in zip(load_problems("minerva_math", DATA / "minerva_math"), raw_rows("minerva_math")):
        sol = r["solution"]
        assert p["answer"] and p["answer"] in sol and sol.rfind("\\boxed") < sol.rfind(p["answer"])
    for p, r in zip(load_problems("svamp", DATA / "svamp"), raw_rows("svamp")):
        assert float(p["answer"]) == r["Answer"] and r["Question"].strip() in p["question"]
    for p, r in zip(load_problems("amc23", DATA / "amc23"), raw_rows("amc23")):
        assert float(p["answer"]) == r["answer"] and "." not in p["answer"]
    for p, r in zip(load_problems("asdiv", DATA / "asdiv"), raw_rows("asdiv")):
        assert r["answer"].startswith(p["answer"]) and "(" not in p["answer"].replace(r["answer"], "")
    for p, r in zip(load_problems("aqua", DATA / "aqua"), raw_rows("aqua")):
        assert p["answer"] == r["correct"] and "(A) " in p["question"] and "(E) " in p["question"]
    for p, r in zip(load_problems("mmlu_stem", DATA / "mmlu_stem"), raw_rows("mmlu_stem")):
        assert "ABCD".index(p["answer"]) == int(r["answer"]) and r["choices"][int(r["answer"])] in p["question"]
    for p, r in zip(load_problems("ifeval", DATA / "ifeval"), raw_rows("ifeval")):
        assert p["id"] == f"ifeval/test/{r['key']}" and p["meta"]["kwargs"] == r["kwargs"]


def test_normalize_id():
    assert normalize_id("MATH/Test/Precalculus/807") == "math/test/precalculus/807"
    assert normalize_id(" Intermediate Algebra / 12 ") == "intermediate-algebra/12"
    assert normalize_id("ｆｕｌｌ－width") == "full-width"  # NFKC
    for raw in ["a b/c  d", "x:y", "Ünïcode/ß"]:
        assert normalize_id(normalize_id(raw)) == normalize_id(raw)
    assert make_id("svamp", "test", "chal-777") == "svamp/test/chal-777"


def write(tmp_path, lines, name="test.jsonl"):
    p = tmp_path / "toy" / name
    p.parent.mkdir(exist_ok=True)
    p.write_text("\n".join(lines) + "\n")
    return p


def test_malformed_rows_name_file_and_line(tmp_path):
    good = json.dumps({"question": "q", "answer": "x\n#### 3"})
    p = write(tmp_path, [good, "", good.replace("3", "4"), '{"question": "q", "answer": '])
    with pytest.raises(DataFormatError, match=re.escape(f"{p}:4: invalid JSON")):
        load_problems("gsm8k", p)
    p = write(tmp_path, [good, json.dumps({"question": "q"})])
    with pytest.raises(DataFormatError, match=re.escape(f"{p}:2: missing field 'answer'")):
        load_problems("gsm8k", p)
    p = write(tmp_path, [good, json.dumps({"question": 5, "answer": "#### 1"})])
    with pytest.raises(DataFormatError, match=rf"{re.escape(str(p))}:2: field 'question' should be str"):
        load_problems("gsm8k", p)
    p = write(tmp_path, [json.dumps({"question": "q", "answer": "no marker"})])
    with pytest.raises(DataFormatError, match=":1: answer has no"):
        load_problems("gsm8k", p)
    p = write(tmp_path, ["[1, 2]"])
    with pytest.raises(DataFormatError, match=":1: expected a JSON object"):
        load_problems("gsm8k", p)
    row = {"id": 1, "question": "q", "answer": 2.0}
    p = write(tmp_path, [json.dumps(row), json.dumps(row)])
    with pytest.raises(DataFormatError, match=":2: duplicate problem id 'amc23/test/1'"):
        load_problems("amc23", p)
    with pytest.raises(KeyError, match="unknown data set"):
        load_problems("nope", p)


def test_generic_jsonl_loader(tmp_path):
    problems = load_jsonl_problems(DATA / "math500" / "test.jsonl",
                                   {"question": "problem", "answer": "answer", "solution": "solution", "id": "unique_id"})
    assert problems[0]["id"] == "math500/test/test/precalculus/807.json"
    assert set(problems[0]["meta"]) == {"subject", "level", "line"}
    p = write(tmp_path, [json.dumps({"Q": "What?", "A": 3.0, "extra": 1}), json.dumps({"Q": "Why?", "A": "x"})],
              name="dev.jsonl")
    rows = load_jsonl_problems(p, {"question": "Q", "answer": "A"})
    assert [r["id"] for r in rows] == ["toy/dev/0", "toy/dev/1"] and rows[0]["answer"] == "3"
    assert rows[0]["meta"] == {"extra": 1, "line": 1}
    with pytest.raises(ValueError, match="missing"):
        load_jsonl_problems(p, {"question": "Q"})
    with pytest.raises(DataFormatError, match=":1: missing field 'nope'"):
        load_jsonl_problems(p, {"question": "nope", "answer": "A"})


def test_last_boxed():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert last_boxed("no box") is None and last_boxed("\\boxed{unclosed") is None


@pytest.mark.skipif(importlib.util.find_spec("datasets") is not None, reason="datasets is installed")
def test_hf_loader_imports_datasets_lazily():
    with pytest.raises(ImportError, match="datasets"):
        load_hf_problems("gsm8k", "openai/gsm8k", config="main")
