"""Naming and loading the checkpoints a probe compares.

A checkpoint is given on the command line as `PATH`, `NAME=PATH` or `NAME@STEP=PATH` (a Hugging Face
model folder); `training_checkpoints(train_dir, base_model_dir, out_root)` exports every DeepSpeed
checkpoint tag `step<N>` of a GRPO run (`train_dir/checkpoints`) with `rlvr_core.artifacts.export` (verified,
reused when already exported) so a probe can follow the run step by step.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlvr_core.artifacts.export import export_checkpoint, verify_local_export
from rlvr_core.probe.tables import Checkpoint
from rlvr_core.sampling.models import load_model

__all__ = ["parse_checkpoint", "training_checkpoints", "load_checkpoint_model"]

_STEP_TAG = re.compile(r"^step(\d+)$")


def parse_checkpoint(spec: str) -> Checkpoint:
    """`PATH` | `NAME=PATH` | `NAME@STEP=PATH` -> Checkpoint (name defaults to the folder name)."""
    if "=" in spec:
        left, path = spec.split("=", 1)
        name, _, step = left.partition("@")
        if step and not step.isdigit():
            raise ValueError(f"checkpoint {spec!r}: STEP must be a whole number, got {step!r}")
        return Checkpoint(name or Path(path).name, int(step) if step else None, path)
    return Checkpoint(Path(spec).name, None, spec)


def training_checkpoints(train_dir: str | Path, base_model_dir: str | Path, out_root: str | Path, *,
                         dtype: str = "float32") -> list[Checkpoint]:
    """Every `step<N>` DeepSpeed tag of a GRPO run, exported to `out_root/step<N>` (sorted by step)."""
    ckpt_dir = Path(train_dir) / "checkpoints"
    tags = sorted((int(m.group(1)), p.name) for p in ckpt_dir.iterdir() if p.is_dir() and (m := _STEP_TAG.match(p.name))) \
        if ckpt_dir.is_dir() else []
    if not tags:
        raise FileNotFoundError(f"no step<N> checkpoint tags under {ckpt_dir}")
    out = []
    for step, tag in tags:
        dest = Path(out_root) / tag
        try:
            verify_local_export(dest)
        except Exception:  # noqa: BLE001 — absent, partial or damaged: export again
            export_checkpoint(ckpt_dir, tag, base_model_dir=base_model_dir, out_dir=dest, dtype=dtype, overwrite=True)
        out.append(Checkpoint(tag, step, str(dest)))
    return out


def load_checkpoint_model(ck: Checkpoint, dtype: str = "float32", device: str = "cpu"):
    """(model, tokenizer) of a checkpoint folder, in eval mode on `device`."""
    if ck.path is None:
        raise ValueError(f"checkpoint {ck.name!r} has no path")
    model, tok = load_model(ck.path, dtype)
    return model.to(device), tok
