"""GRPO through the tools environment on the CPU, as the pipeline runs it: the trainer samples whole trajectories,
records the step's `env/...` columns, writes each logged completion's trajectory as segments
(train/rollout_segments.parquet), and the warehouse stores them (`rollout_segments`). Read back from the warehouse,
a trajectory replays through the base model to the log-probs the engine sampled it with (token-in/token-out held
from the rollout to the table), and to the loss the rows read from the file give."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "grpo"))
from grpo_helpers import tiny_cfg  # noqa: E402

from rlvr_core.artifacts.storage import LocalStore  # noqa: E402
from rlvr_core.data.synthetic import ProductsSpec, make_products_dataset  # noqa: E402
from rlvr_core.environments.trajectory import from_rows  # noqa: E402
from rlvr_core.experiment.config import RewardConfig  # noqa: E402
from rlvr_core.experiment.environment_config import EnvironmentConfig  # noqa: E402
from rlvr_core.grpo.logprobs import sequence_logprobs  # noqa: E402
from rlvr_core.grpo.losses import grpo_loss  # noqa: E402
from rlvr_core.grpo.trainer import train_grpo  # noqa: E402
from rlvr_core.grpo.update import _groups_batch  # noqa: E402
from rlvr_core.records import warehouse  # noqa: E402
from rlvr_core.records.runrecord import upload_run_folder, write_run_folder  # noqa: E402
from rlvr_core.sampling.trajectories import as_sample  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def run(taught_engine, tmp_path_factory):
    base = tmp_path_factory.mktemp("tool_base")
    taught_engine.model.save_pretrained(base)
    taught_engine.tokenizer.save_pretrained(base)
    rows = make_products_dataset(ProductsSpec(n_train=16, n_test=2, digits=(2, 1), seed=0))["train"]
    out = tmp_path_factory.mktemp("tool_grpo")
    cfg = tiny_cfg(steps=2, temperature=1.0, rollout_samples_per_step=100,
                   guards={"health": {"no_signal": {"serious": False}}})  # 2 steps of a 4-text model: no signal
    env = EnvironmentConfig(name="tools", max_turns=3, max_total_tokens=64)
    result = train_grpo(base, rows, [r["id"] for r in rows], out, cfg, template_id="qa",
                        reward=RewardConfig(verifier="gsm8k"), max_new_tokens=24, seed=0, environment=env)
    return base, out, result


def _trajectories(rows):
    by_key: dict[tuple, list] = {}
    for r in rows:
        by_key.setdefault((r["step"], r["prompt_id"], r["sample_index"]), []).append(r)
    return {k: from_rows(v) for k, v in by_key.items()}


def test_the_trainer_runs_the_environment_and_records_its_columns(run):
    _, out, result = run
    steps = pq.read_table(result.steps_path).to_pylist()
    assert len(steps) == 2
    assert max(r["env/tool_call_rate"] for r in steps) > 0  # the taught model calls the calculator
    assert all(r["env/turns_mean"] >= 1 and r["env/rerender_drift"] >= 0 for r in steps)
    # The environment's flags are per-step flags like the others: health/ columns, counted in the summary.
    assert all(f"health/{g}" in r for g in ("G-tool-errors", "G-turn-budget", "G-rerender-drift") for r in steps)
    assert result.summary["guards"]["health/G-rerender-drift"] == sum(r["health/G-rerender-drift"] for r in steps)
    logged = pq.read_table(out / "rollouts.parquet").to_pylist()
    trajs = _trajectories(pq.read_table(out / "rollout_segments.parquet").to_pylist())
    assert set(trajs) == {(r["step"], r["prompt_id"], r["sample_index"]) for r in logged}  # one per completion
    for r in logged:
        t = trajs[r["step"], r["prompt_id"], r["sample_index"]]
        assert t.text == r["completion"] and t.reward == r["reward"]
        assert len(t.completion_ids()) == r["length"]  # the trainer's length counts every id after the prompt
    assert any(t.tool_calls and any(s.role == "env" for s in t.segments) for t in trajs.values())


def test_segments_in_the_warehouse_replay_to_the_sampled_logprobs_and_the_same_loss(run, tmp_path):
    base, out, _ = run
    table = pq.read_table(out / "rollout_segments.parquet")
    local = write_run_folder(tmp_path / "r1", run={"run_id": "r1", "experiment": "exp", "name": "tools",
                                                   "kind": "train", "status": "FINISHED"},
                             params={}, manifest={}, config_yaml="", summary={},
                             tables={"train/rollout_segments.parquet": table,
                                     "train/rollouts.parquet": pq.read_table(out / "rollouts.parquet")})
    store, db = LocalStore(tmp_path / "store"), tmp_path / "w.duckdb"
    upload_run_folder(store, "exp/r1", local)
    warehouse.ingest_run(store, "exp/r1", db)
    stored = warehouse.query_records("select * from rollout_segments where run_id = 'r1'", path=db)
    assert len(stored) == table.num_rows
    from_db, from_file = _trajectories(stored), _trajectories(table.to_pylist())
    assert from_db == from_file

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(base).eval(), AutoTokenizer.from_pretrained(base)
    first = [t for (step, _, _), t in sorted(from_db.items()) if step == 1]  # sampled by the base model
    sampler = SimpleNamespace(pad_token_id=tok.pad_token_id, add_special_tokens=False)

    def replay(trajs):
        group = SimpleNamespace(samples=[as_sample(t, f"p{i}", 0) for i, t in enumerate(trajs)], prompt="")
        batch, old, mask = _groups_batch([group], tok, sampler, torch.device("cpu"))
        with torch.no_grad():
            logp, _ = sequence_logprobs(model, batch)
        return logp, old, mask

    logp, old, mask = replay(first)
    assert bool(mask.any()) and float((logp - old)[mask].abs().max()) < 1e-4
    adv = torch.tensor([t.reward - 0.5 for t in first])
    loss_db = grpo_loss(logp, old, adv, mask)[0]
    logp2, old2, mask2 = replay([from_file[k] for k in sorted(from_file) if k[0] == 1])
    assert float(loss_db) == float(grpo_loss(logp2, old2, adv, mask2)[0])


def test_per_turn_advantages_train_through_the_trainer(taught_engine, tmp_path):
    """turn_advantage: to_go with a failed call's turn reward: the trainer builds (B, T) token advantages (each turn's
    on its model ids, 0 on observations) and trains; the tool-call turns the loop logged carry the turn rewards."""
    base = tmp_path / "base"
    taught_engine.model.save_pretrained(base)
    taught_engine.tokenizer.save_pretrained(base)
    rows = make_products_dataset(ProductsSpec(n_train=16, n_test=2, digits=(2, 1), seed=0))["train"]
    cfg = tiny_cfg(steps=1, temperature=1.0, rollout_samples_per_step=100,
                   guards={"health": {"no_signal": {"serious": False}}})
    env = EnvironmentConfig(name="tools", max_turns=3, max_total_tokens=64, turn_advantage="to_go",
                            tool_error_reward=-0.2)
    result = train_grpo(base, rows, [r["id"] for r in rows], tmp_path / "out", cfg, template_id="qa",
                        reward=RewardConfig(verifier="gsm8k"), max_new_tokens=24, seed=0, environment=env)
    (step,) = pq.read_table(result.steps_path).to_pylist()
    assert math.isfinite(step["loss"]) and step["env/tool_call_rate"] > 0
