"""The GRPO stage's state on disk: resume, checkpoints, steps/rollouts Parquet files, the final model.

Checkpoints: DeepSpeed `save_checkpoint(out_dir/checkpoints, tag=step<N>)` every `cfg.checkpoint_every`
steps and at the end of every call, with the step, the data position and the metric rows so far in the
client state. If `out_dir/checkpoints` already holds one, the run resumes there (`resume`): model,
optimizer, lr schedule, step and data position are restored, and since every sampling seed is a function
of (seed, prompt id, epoch, step, sample index), the resumed run sees the same prompts and draws. With
max_staleness s > 0 a checkpoint also holds the s policy versions before it (`ahead_weights.pt` in its tag
folder, written before DeepSpeed's files), which the first steps after a resume sample with.

rollouts.parquet is rewritten at every checkpoint, just before it (and when a serious guard stops the run);
a call starts from the rows of the steps up to its resume point and drops later ones, so a resumed run
neither duplicates nor loses rows. Only rank 0 writes files; checkpoints are collective.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlvr_core.artifacts.export import LORA_CONFIG  # written beside the checkpoints: what export needs to merge adapters
from rlvr_core.artifacts.layout import ROLLOUTS_FILE, SEGMENTS_FILE, STEPS_FILE
from rlvr_core.experiment.config import GRPOConfig

__all__ = ["CHECKPOINTS", "FINAL_MODEL", "LORA_ADAPTER", "STEPS_FILE", "ROLLOUTS_FILE",
           "AHEAD_WEIGHTS", "RunState", "resume", "save_checkpoint", "write_rollouts", "write_lora_config",
           "save_final_model", "write_rows", "_read_rollouts"]

CHECKPOINTS = "checkpoints"
FINAL_MODEL = "final_model"
LORA_ADAPTER = "lora_adapter"  # with lora_rank > 0: the trained adapters alone, in peft's format
AHEAD_WEIGHTS = "ahead_weights.pt"  # in a checkpoint's tag folder with max_staleness > 0: the versions before it


@dataclass
class RunState:
    """What a checkpoint restores, and what the loop advances."""

    start_step: int = 0               # steps already done when this call started
    step_rows: list[dict] = field(default_factory=list)   # one metric row per step done
    # Curriculum position of the next step's first prompt. Without dynamic sampling it is step * P; with it,
    # it advances by every prompt a step sampled, so it is checkpointed with the step.
    data_pos: int = 0
    ahead_weights: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)  # max_staleness > 0
    rollout_rows: list[dict] = field(default_factory=list)  # rank 0: rollouts.parquet's rows so far
    segment_rows: list[dict] = field(default_factory=list)  # rank 0: rollout_segments.parquet's (multi-turn)
    resumed_from: str | None = None   # the checkpoint loaded, if any


def resume(engine: Any, out_dir: Path, cfg: GRPOConfig, device: torch.device, *, is_main: bool) -> RunState:
    """The state to start from: the latest checkpoint under out_dir/checkpoints (loaded into `engine`:
    collective), or a fresh start."""
    ckpt_dir, state = out_dir / CHECKPOINTS, RunState()
    if (ckpt_dir / "latest").is_file():
        path, client = engine.load_checkpoint(str(ckpt_dir))
        if path is None:
            raise RuntimeError(f"{ckpt_dir} has a 'latest' file but DeepSpeed could not load it")
        state.start_step, state.step_rows = int(client["step"]), list(client["step_rows"])
        # checkpoints from before dynamic sampling have no data_pos
        state.data_pos = int(client.get("data_pos", state.start_step * cfg.prompts_per_step))
        if cfg.max_staleness and state.start_step:
            saved = ckpt_dir / f"step{state.start_step}" / AHEAD_WEIGHTS
            if not saved.is_file():
                raise RuntimeError(f"resuming with max_staleness={cfg.max_staleness} needs {saved} (the policy "
                                   "versions the next steps sample with); the checkpoint was saved without it")
            state.ahead_weights = torch.load(saved, map_location=device, weights_only=True)
        state.resumed_from = str(path)
    # Rollout samples of the steps up to the resume point; rows of later steps (written by a call killed
    # before its checkpoint) are dropped here and sampled again, so nothing is duplicated.
    state.rollout_rows = _read_rollouts(out_dir / ROLLOUTS_FILE, state.start_step) if is_main else []
    state.segment_rows = _read_rollouts(out_dir / SEGMENTS_FILE, state.start_step) if is_main else []
    return state


def write_rollouts(state: RunState, out_dir: Path, *, is_main: bool) -> None:
    """rollouts.parquet and, for a multi-turn run, rollout_segments.parquet (the same completions' trajectories)."""
    for rows, name in ((state.rollout_rows, ROLLOUTS_FILE), (state.segment_rows, SEGMENTS_FILE)):
        if is_main and (rows or (out_dir / name).exists()):
            write_rows(rows, out_dir / name)


def save_checkpoint(engine: Any, out_dir: Path, step: int, state: RunState, ahead: Any, *, is_main: bool) -> None:
    """Checkpoint after `step` steps (collective: under ZeRO every rank writes its own partition of the
    model/optimizer state), with rollouts.parquet first and steps.parquet after."""
    # Rollouts first: if the job dies before the checkpoint below, the resume drops their extra rows
    # (steps after the checkpoint it resumes from); written after it, they could be lost instead.
    write_rollouts(state, out_dir, is_main=is_main)
    ckpt_dir = out_dir / CHECKPOINTS
    if ahead is not None and is_main:  # before DeepSpeed's files and its `latest`: a resume finds both
        (ckpt_dir / f"step{step}").mkdir(parents=True, exist_ok=True)
        torch.save(ahead.for_checkpoint(step), ckpt_dir / f"step{step}" / AHEAD_WEIGHTS)
    engine.save_checkpoint(str(ckpt_dir), tag=f"step{step}", save_latest=False,
                           client_state={"step": step, "step_rows": state.step_rows, "data_pos": state.data_pos})
    # DeepSpeed's own `latest` is written by rank 0 before its closing barrier, i.e. possibly while another
    # rank is still writing its partition: a node lost then leaves a `latest` naming a checkpoint that cannot
    # be loaded. save_checkpoint returns after that barrier, so every rank's files are complete here.
    if is_main:
        _write_latest(ckpt_dir, f"step{step}")
        write_rows(state.step_rows, out_dir / STEPS_FILE)


def _write_latest(ckpt_dir: Path, tag: str) -> None:
    """ckpt_dir/latest (DeepSpeed's pointer to the checkpoint to load), replaced atomically."""
    tmp = ckpt_dir / "latest.tmp"
    tmp.write_text(tag)
    os.replace(tmp, ckpt_dir / "latest")


def write_lora_config(module: Any, ckpt_dir: Path) -> None:
    """checkpoints/lora_config.json: rank, alpha, targets, which export reads to merge the adapters itself."""
    lc = module.peft_config["default"]
    targets = sorted(lc.target_modules) if isinstance(lc.target_modules, (set, list)) else lc.target_modules
    (ckpt_dir / LORA_CONFIG).write_text(json.dumps({
        "r": lc.r, "lora_alpha": lc.lora_alpha, "use_rslora": bool(getattr(lc, "use_rslora", False)),
        "target_modules": targets,
    }, indent=2) + "\n")


def save_final_model(trained: torch.nn.Module, cfg: GRPOConfig, out_dir: Path) -> None:
    """out_dir/final_model (rank 0 only): the trained weights in fp32, LoRA adapters merged (the adapters
    alone go to out_dir/lora_adapter); the trainer adds the tokenizer. from_pretrained-loadable."""
    if cfg.lora_rank:
        # The adapters alone (peft format, small), then the merged model as the loadable final model.
        trained.save_pretrained(out_dir / LORA_ADAPTER)
        trained = copy.deepcopy(trained).merge_and_unload()
    if cfg.precision != "fp32":  # export fp32 weights, like the base model
        trained = copy.deepcopy(trained).float()
    trained.save_pretrained(out_dir / FINAL_MODEL)


def write_rows(rows: list[dict], path: Path) -> None:
    """Parquet of the step rows; eval columns exist only on evaluated steps, so take the union of keys
    (from_pylist would infer the schema from the first row and drop them). Written to a temporary file
    and renamed, so a kill mid-write leaves the previous file whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys = list(dict.fromkeys(k for r in rows for k in r))
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows]), tmp)
    os.replace(tmp, path)


def _read_rollouts(path: Path, up_to_step: int) -> list[dict]:
    """The rollout rows of steps 1..up_to_step already in `path` (none when it does not exist)."""
    import pyarrow.parquet as pq

    if not path.exists():
        return []
    return [r for r in pq.read_table(path).to_pylist() if r["step"] <= up_to_step]
