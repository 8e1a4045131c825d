"""`rlvr verify` (verify_command): output lines = input + status/reward/extracted; counts; bad lines named."""

import json

import typer
from typer.testing import CliRunner

from rlvr_cli.verify import InputError, read_rows, verify_command

app = typer.Typer()
app.command("verify")(verify_command)
app.command("noop")(lambda: None)  # a second command so typer keeps "verify" as a sub-command


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_verify_gsm8k_file(tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(inp, [
        {"id": 1, "response": " 3 + 4 = 7\n5 * 7 = 35\n#### 35", "answer": "35"},
        {"id": 2, "response": "#### 36", "answer": "x\n#### 35"},
        {"id": 3, "response": "no idea", "answer": "35"},
    ])
    res = CliRunner().invoke(app, ["verify", "--verifier", "gsm8k", "--mode", "strict", "--input", str(inp),
                                   "--output", str(out), "--workers", "0"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["status"], r["reward"], r["extracted"]) for r in lines] == [
        (1, "correct", 1.0, "35"), (2, "incorrect", 0.0, "36"), (3, "no_answer", 0.0, None)]
    assert "correct    1" in res.output and "no_answer  1" in res.output


def test_verify_ifeval_and_code_fields(tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(inp, [{"response": "no commas", "prompt": "p", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}])
    res = CliRunner().invoke(app, ["verify", "--verifier", "ifeval", "--input", str(inp), "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["status"] == "correct"
    write(inp, [{"response": "```python\ndef f():\n    return 1\n```", "tests": ["assert f() == 1"]}])
    res = CliRunner().invoke(app, ["verify", "--verifier", "code", "--input", str(inp), "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["status"] == "correct"


def test_in_process_is_refused_for_verifiers_that_can_hang(tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(inp, [{"response": "$\\boxed{2}$", "answer": "2"}])
    res = CliRunner().invoke(app, ["verify", "--verifier", "math", "--input", str(inp), "--output", str(out),
                                   "--workers", "0"])
    assert res.exit_code == 2 and "can hang" in res.output, res.output
    assert not out.exists()


def test_malformed_line_names_file_and_line(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"response": "1", "answer": "1"}\n\n{"response": "2"\n')
    try:
        read_rows(inp, "gsm8k")
    except InputError as exc:
        assert f"{inp}:3" in str(exc)
    else:
        raise AssertionError("no error")
    inp.write_text('{"response": "1"}\n')
    res = CliRunner().invoke(app, ["verify", "--verifier", "gsm8k", "--input", str(inp), "--output", str(tmp_path / "o.jsonl")])
    assert res.exit_code == 2 and f"{inp}:1" in res.output and "'answer'" in res.output
