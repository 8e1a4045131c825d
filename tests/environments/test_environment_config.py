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
