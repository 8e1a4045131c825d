"""rlvr_core/data/gold.py: the one place a row's gold is decided, for problem rows and `rlvr verify`'s lines."""

import pytest

from rlvr_core.data.gold import gold_of, line_gold

IFEVAL = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}


def test_a_problem_rows_gold_per_verifier():
    problem = {"id": "x/test/1", "question": "Write.", "answer": "42", "solution": "6*7", "meta": {**IFEVAL,
                                                                                               "tests": "assert f()"}}
    assert gold_of(problem) == gold_of(problem, "gsm8k") == gold_of(problem, "mcq") == "42"
    assert gold_of(problem, "ifeval") == {**IFEVAL, "prompt": "Write."}
    assert gold_of(problem, "code") == "assert f()"
    synthetic = {"question": "1+1?", "answer": "1+1 = 2 #### 2", "final_answer": "2"}
    assert gold_of(synthetic) == "2"  # the bare number, not the worked solution
    with pytest.raises(KeyError, match="meta"):
        gold_of({"question": "q", "answer": "1"}, "code")


def test_a_verify_lines_gold_reads_the_top_level_fields():
    assert line_gold("gsm8k", {"response": "r", "answer": "7", "final_answer": "8"}) == "7"
    assert line_gold("ifeval", {**IFEVAL}) == {**IFEVAL, "prompt": ""}
    assert line_gold("ifeval", {**IFEVAL, "prompt": "Write."})["prompt"] == "Write."
    assert line_gold("code", {"tests": ["assert 1"]}) == ["assert 1"]
    with pytest.raises(KeyError, match="instruction_id_list"):
        line_gold("ifeval", {"kwargs": [{}]})
