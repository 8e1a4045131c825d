"""The training stage resumes from its checkpoint on another host: its folder is keyed by its inputs, not by
the thread count or CPU instruction set (`numerics`) or the memory settings (`grpo.memory`, a section declared
out of the key: `grpo_key_dump`), which it records instead (rlvr_core.pipeline.stages).

A real `train` stage child (rlvr_core.pipeline.child.stage, one torch thread) is SIGKILLed after its first checkpoint,
as a pre-emption would; the same stage then runs in this process at two threads and with smaller
micro-batches, as a retry on a host with other numerics after a G-oom line would, and must continue from
that checkpoint.
"""

from __future__ import annotations

import io
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlvr_core.artifacts.export import train_template_of
from rlvr_core.artifacts.storage import LocalStore
from rlvr_core.core.progress import Progress
from rlvr_core.experiment.config import parse_config
from rlvr_core.pipeline import stages
from rlvr_core.sampling.models import model_hashes
from rlvr_core.pipeline.child.errors import StageProcessError
from tasks.stage_process import run_stage_process

STEPS = 40  # ~0.05 s a step: long enough after the first checkpoint for the killer to act under load


def _inputs(tiny, tmp_path: Path):
    cfg = parse_config({"data": {"synthetic": {"n_train": 40, "n_test": 4}}, "sampling": {"max_new_tokens": 12},
                        "eval": {"max_problems": 2, "verifier_workers": 0}, "reward": {"workers": 0},
                        "grpo": {"enabled": True, "steps": STEPS, "prompts_per_step": 4, "group_size": 4, "lr": 1e-2,
                                 "warmup_steps": 0, "checkpoint_every": 2,
                                 # a tiny base on hard prompts learns nothing, by design: G-no-signal only flags
                                 "guards": {"health": {"no_signal": {"serious": False}}}}}, "<resume test>")
    data = stages.prepare_data(cfg)
    model_dir = Path(tiny[0])
    base = stages.ModelArtifact(str(model_dir), "tiny", *model_hashes(model_dir), True)
    cur_path = tmp_path / "curriculum.parquet"
    pq.write_table(pa.table({"problem_id": [r["id"] for r in data.train_rows()[:12]]}), cur_path)
    return cfg, data, base, stages.CurriculumArtifact(str(cur_path), "resume-test", 12, False)


def _kill_after_first_checkpoint(home: Path, stop: threading.Event) -> None:
    """SIGKILL this process's stage child once a training folder has a checkpoint (`checkpoints/latest`)."""
    while not stop.wait(0.05):
        if list((home / "cache" / "grpo").glob("*/checkpoints/latest")):
            for child in psutil.Process().children(recursive=True):
                try:  # other children of this test process (earlier tests' leftovers) may be zombies or gone
                    if "rlvr_core.pipeline.child.stage" in child.cmdline():
                        os.kill(child.pid, signal.SIGKILL)
                except (psutil.Error, ProcessLookupError):
                    continue
            return


def test_a_killed_training_resumes_from_its_checkpoint_at_another_thread_count(tiny, rlvr_home, tmp_path,
                                                                               monkeypatch):
    cfg, data, base, cur = _inputs(tiny, tmp_path)
    counter = tmp_path / "memory.events"
    counter.write_text("oom_kill 0\n")  # no OOM kill happens: the kill below is a pre-emption
    monkeypatch.setenv("RLVR_OOM_KILL_FILE", str(counter))
    monkeypatch.setenv("RLVR_STAGE_THREADS", "1")
    request = {"config": cfg.resolved(), "data": asdict(data), "base": asdict(base), "curriculum": asdict(cur)}
    stop = threading.Event()
    killer = threading.Thread(target=_kill_after_first_checkpoint, args=(rlvr_home, stop), daemon=True)
    killer.start()
    t0 = time.monotonic()
    with ThreadPoolExecutor(1) as pool, pytest.raises(StageProcessError) as killed:
        pool.submit(run_stage_process, "train", request).result(timeout=300)
    stop.set()
    assert killed.value.transient and killed.value.returncode == -signal.SIGKILL, str(killed.value)
    [folder] = [p.parents[1] for p in (rlvr_home / "cache" / "grpo").glob("*/checkpoints/latest")]
    at = int((folder / "checkpoints" / "latest").read_text().strip().removeprefix("step"))
    assert 2 <= at < STEPS and not (folder / ".done").exists()

    lines = io.StringIO()
    threads = torch.get_num_threads()
    grpo = cfg.resolved()["grpo"]
    smaller = parse_config({**cfg.resolved(), "grpo": {**grpo, "memory": {**grpo["memory"], "micro_batch_size": 4}}},
                           "<resume>")
    try:
        torch.set_num_threads(2)  # the retry's host: another thread count; and micro-batches, as G-oom advises
        trained = stages.train_stage(smaller, data, base, cur, Progress(True, lines))
    finally:
        torch.set_num_threads(threads)

    assert Path(trained.folder) == folder and trained.summary["resumed_from_step"] == at
    assert [r["step"] for r in pq.read_table(trained.steps_path).to_pylist()] == list(range(1, STEPS + 1))
    assert trained.summary["numerics"]["torch_threads"] == 1
    [change] = trained.summary["numerics_changes"]
    assert change["from_step"] == at
    assert change["before"]["torch_threads"] == 1 and change["after"]["torch_threads"] == 2
    assert change["before"]["grpo.micro_batch_size"] is None and change["after"]["grpo.micro_batch_size"] == 4
    said = [ln for ln in lines.getvalue().splitlines() if "numerics changed" in ln]
    assert len(said) == 1, lines.getvalue()
    assert f"checkpoint at step {at} (torch_threads 1 -> 2, grpo.micro_batch_size None -> 4)" in said[0], said[0]
    print(f"killed at step {at}, resumed and finished in {time.monotonic() - t0:.1f} s")

    # G-prompt-mismatch: the stage records the template it trained with, its export carries it, and the pipeline's
    # evaluation of the export (the nightly flow's too) compares it with the config's: the same template here.
    assert trained.summary["prompt_template"] == "qa@1" and trained.summary["template_warnings"] == []
    exported = stages.export_stage(trained, base, LocalStore(tmp_path / "store"), "run/checkpoints/final")
    assert train_template_of(exported.model.path) == "qa@1"
    ev = stages.evaluate_stage(cfg, data, exported.model, eval_id="trained")
    assert (ev.summary["train_template"], ev.summary["template_mismatch"]) == ("qa@1", False)
