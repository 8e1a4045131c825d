"""The `environment:` section and the tool demo's data: validated before any work, keyed only when multi-turn, and
demonstrations that call the calculator at the configured share."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rlvr_core.data.synthetic import ProductsSpec, make_products_dataset, tool_answer
from rlvr_core.experiment.config import ConfigError, load_config, parse_config
from rlvr_core.tiny.spec import WarmStartSpec
from rlvr_core.tiny.warmstart import _demonstration

ROOT = Path(__file__).resolve().parents[2]


def test_the_tool_demo_recipe_is_valid_and_multi_turn():
    cfg = load_config(ROOT / "configs" / "examples" / "tool-demo.yaml")
    assert cfg.environment.multi_turn and cfg.environment.tools == ["calculator"]
    assert cfg.data.synthetic.task == "products" and cfg.model.warm_start.teacher_tool_share == 0.5


@pytest.mark.parametrize("data,field,words", [
    ({"environment": {"name": "browser"}}, "environment.name", "unknown environment 'browser'"),
    ({"environment": {"name": "tools", "tools": []}}, "environment.tools", "non-empty"),
    ({"environment": {"name": "tools", "max_turns": 1}}, "environment", "max_turns >= 2"),
    ({"environment": {"name": "tools"}, "grpo": {"max_staleness": 1}}, "environment.name", "max_staleness: 0"),
])
def test_a_bad_environment_fails_before_any_work_naming_the_field(data, field, words):
    with pytest.raises(ConfigError) as err:
        parse_config(data, "exp.yaml")
    assert any(f == field and words in why for f, why in err.value.problems), err.value.problems


@pytest.mark.parametrize("engine", ["hf", "vllm", "vllm-server"])
def test_every_engine_runs_a_multi_turn_environment(engine):
    """Each engine takes token ids (generate_ids); tests/environments/test_vllm_multi_turn.py runs vLLM's."""
    sampling = {"engine": engine, **({"servers": ["http://127.0.0.1:8000"]} if engine == "vllm-server" else {})}
    cfg = parse_config({"environment": {"name": "tools"}, "sampling": sampling}, "exp.yaml")
    assert cfg.environment.multi_turn and cfg.sampling.engine == engine


def test_single_turn_leaves_the_training_key_as_it_was():
    from rlvr_core.pipeline.train_stage import _train_key

    class Base:
        model_hash = "m"

    class Curriculum:
        curriculum_id = "c"

    plain = _train_key(parse_config({}), Base, Curriculum)
    assert "environment" not in plain
    tools = _train_key(parse_config({"environment": {"name": "tools"}}), Base, Curriculum)
    assert tools["environment"]["tools"] == ["calculator"] and {k: v for k, v in tools.items()
                                                                if k != "environment"} == plain


def test_products_are_deterministic_disjoint_and_worked_with_the_tool():
    a = make_products_dataset(ProductsSpec(n_train=300, n_test=50, seed=1))
    b = make_products_dataset(ProductsSpec(n_train=300, n_test=50, seed=1))
    assert a == b
    assert not {r["question"] for r in a["train"]} & {r["question"] for r in a["test"]}
    row = a["test"][0]
    x, y = (int(t) for t in row["question"].removeprefix("What is ").removesuffix("?").split(" * "))
    assert 100 <= x <= 999 and 10 <= y <= 99 and row["final_answer"] == str(x * y)
    assert row["answer"] == tool_answer(x, y) == f"<calculator>{x}*{y}</calculator>\n= {x * y}\n#### {x * y}"


def test_demonstrations_call_the_tool_at_the_configured_share():
    rows = make_products_dataset(ProductsSpec(n_train=2000, n_test=10))["train"]
    rng = random.Random(0)
    demos = [_demonstration(r, WarmStartSpec(teacher_tool_share=0.3), rng) for r in rows]
    called = sum(d.startswith("<calculator>") for d in demos) / len(demos)
    assert 0.26 < called < 0.34
    direct = next(d for d, r in zip(demos, rows) if not d.startswith("<calculator>"))
    assert direct.startswith("#### ") and direct.count("\n") == 0


def test_the_warm_start_trains_what_the_policy_writes_not_the_tool_answer_nor_head_digits():
    """A calculator demonstration is encoded as the tools environment builds the trajectory (the call, the
    observation ids the default boundary writes, the final answer), with labels only on the model's pieces; a head
    answer trains "####" and eos but not the product's digits; a word problem stays one trained piece."""
    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from rlvr_core.environments.boundary import TextBoundary
    from rlvr_core.experiment.environment_config import EnvironmentConfig
    from rlvr_core.tiny.tokenizer import train_tokenizer
    from rlvr_core.tiny.warmstart import _batch, _encode, _texts

    rows = make_products_dataset(ProductsSpec(n_train=200, n_test=10))["train"]
    words = make_synthetic_dataset(SyntheticSpec(n_train=50, n_test=5))["train"]
    pairs = _texts(rows + words, "qa", WarmStartSpec(teacher_tool_share=0.5))
    tok = train_tokenizer([p + "".join(t for t, _ in c) for p, c in pairs], vocab_size=400)
    examples = _encode(tok, pairs)
    batch = _batch(examples, tok.pad_token_id)
    env = EnvironmentConfig()
    boundary = TextBoundary(tok, prefix=env.observation_prefix, suffix=env.observation_suffix)
    kinds = set()
    for i, (row, (prompt, completion, trained)) in enumerate(zip(rows + words, examples)):
        labels = batch["labels"][i, len(prompt): len(prompt) + len(completion)].tolist()
        assert labels == [t if learn else -100 for t, learn in zip(completion, trained)]
        assert completion[-1] == tok.eos_token_id and trained[-1]
        if not row["answer"].startswith("<calculator>"):
            kinds.add("word")
            assert all(trained) and completion[:-1] == tok(pairs[i][1][0][0], add_special_tokens=False)["input_ids"]
            continue
        x, y = row["question"].removeprefix("What is ").removesuffix("?").split(" * ")
        call = tok(f" <calculator>{x}*{y}</calculator>", add_special_tokens=False)["input_ids"]
        final = tok(f"#### {row['final_answer']}", add_special_tokens=False)["input_ids"]
        if completion[: len(call)] == call:
            kinds.add("tool")
            observation = boundary.observation_ids(row["final_answer"])
            assert completion[:-1] == call + observation + final
            assert trained[:-1] == [True] * len(call) + [False] * len(observation) + [True] * len(final)
        else:
            kinds.add("head")
            untrained = tok.decode([t for t, learn in zip(completion, trained) if not learn])
            assert untrained == row["final_answer"] and tok.decode(completion[:-1]) == f" #### {row['final_answer']}"
    assert kinds == {"tool", "head", "word"}
