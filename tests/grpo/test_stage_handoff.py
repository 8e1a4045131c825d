"""Stages on workers that share no disk hand their outputs over through the stage store (`RLVR_STAGE_STORE`,
moto S3 over HTTP on 127.0.0.1; rlvr_core/pipeline/cache.py).

Home A builds the data, the pass-rate table and the curriculum, and is then deleted; home B gets only the
artifacts as Prefect would pass them (JSON, with A's paths), finds each input in the store (`stages.here`), trains
and evaluates. Everything equals one home doing it all without a store (same weights bit for bit: same process,
same thread count), and a third home reuses B's finished training from the store instead of training again.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from grpo_helpers import model_params

from rlvr_core.experiment.config import parse_config
from rlvr_core.pipeline import stages
from rlvr_core.pipeline.cache import STAGE_STORE_ENV, localize
from rlvr_core.sampling.models import model_hashes

pytestmark = [pytest.mark.s3, pytest.mark.usefixtures("one_torch_thread")]


def _cfg():
    return parse_config({"data": {"synthetic": {"n_train": 24, "n_test": 4}}, "sampling": {"max_new_tokens": 12},
                         "passk": {"n_samples": 4, "ks": [1, 4], "max_prompts": 8, "drop_never_solved": False,
                                   "drop_always_solved": False},
                         "eval": {"max_problems": 4, "n_samples": 2, "verifier_workers": 0}, "reward": {"workers": 0},
                         "grpo": {"enabled": True, "steps": 2, "prompts_per_step": 4, "group_size": 4, "lr": 1e-2,
                                  "warmup_steps": 0, "checkpoint_every": 1}}, "<hand-off test>")


def _shared(cfg, base):
    data = stages.prepare_data(cfg)
    passrates = stages.pass_rate_stage(cfg, data, base)
    return data, passrates, stages.curriculum_stage(cfg, data, passrates)


def _home(monkeypatch, path: Path) -> Path:
    monkeypatch.setenv("RLVR_HOME", str(path))
    return path


def test_two_homes_share_only_the_store_and_get_one_homes_results(tiny, rlvr_home, s3_env, tmp_path, monkeypatch):
    endpoint, bucket = s3_env
    cfg, model_dir = _cfg(), Path(tiny[0])
    base = stages.ModelArtifact(str(model_dir), "tiny", *model_hashes(model_dir), True)

    one = _home(monkeypatch, tmp_path / "one-home")  # the reference: no store, every stage here
    ref_data, ref_pr, ref_cur = _shared(cfg, base)
    ref_trained = stages.train_stage(cfg, ref_data, base, ref_cur)
    ref_eval = stages.evaluate_stage(cfg, ref_data, ref_trained.model, eval_id="trained")

    monkeypatch.setenv(STAGE_STORE_ENV, f"s3://{bucket}/stage-cache")
    monkeypatch.setenv("RLVR_S3_ENDPOINT_URL", endpoint)
    home_a = _home(monkeypatch, tmp_path / "worker-a")
    sent = json.loads(json.dumps([asdict(a) for a in _shared(cfg, base)]))  # what crosses to the other worker
    assert sent[0]["train_path"].startswith(str(home_a))
    shutil.rmtree(home_a)  # nothing of A's disk is left for B

    home_b = _home(monkeypatch, tmp_path / "worker-b")
    data = stages.here(stages.DataArtifact(**sent[0]))
    passrates = stages.here(stages.PassRateArtifact(**sent[1]))
    cur = stages.here(stages.CurriculumArtifact(**sent[2]))
    assert all(p.startswith(str(home_b)) for p in (data.train_path, passrates.table_path, cur.path))
    assert pq.read_table(passrates.table_path).equals(pq.read_table(ref_pr.table_path))
    assert pq.read_table(cur.path).equals(pq.read_table(ref_cur.path))
    assert stages.prepare_data(cfg).cached  # found in the store, not generated again
    trained = stages.train_stage(cfg, data, base, cur)
    assert not trained.cached and trained.folder.startswith(str(home_b))
    wa, wb = model_params(ref_trained.model.path), model_params(trained.model.path)
    assert all(bool((wa[k] == wb[k]).all()) for k in wa)
    ev = stages.evaluate_stage(cfg, data, trained.model, eval_id="trained")
    assert ev.summary["accuracy_greedy"] == ref_eval.summary["accuracy_greedy"]
    assert ev.samples.column("response").to_pylist() == ref_eval.samples.column("response").to_pylist()

    _home(monkeypatch, tmp_path / "worker-c")  # a third worker: B's finished training comes from the store
    again = stages.train_stage(cfg, stages.here(data), base, stages.here(cur))
    assert again.cached and again.folder.startswith(str(tmp_path / "worker-c"))
    assert again.model.model_hash == trained.model.model_hash
    assert [r["step"] for r in pq.read_table(again.steps_path).to_pylist()] == [1, 2]
    assert one.is_dir()


def test_a_path_on_no_worker_is_one_clear_error(rlvr_home, monkeypatch):
    monkeypatch.delenv(STAGE_STORE_ENV, raising=False)
    missing = "/elsewhere/home/cache/data/0123456789abcdef0123/train.jsonl"
    with pytest.raises(FileNotFoundError) as e:
        localize(missing)
    assert str(e.value) == (f"{missing} is not on this worker (no stage store: set {STAGE_STORE_ENV} to share "
                            f"stage outputs between workers)")
    assert localize("/elsewhere/model/config.json") == "/elsewhere/model/config.json"  # no stage output: the
    # stage that opens it says what is missing
