"""The base-model stage: the model every later stage starts from (a tiny model warm-started on the training set and
cached on data and spec, a local Hugging Face folder, or a hub snapshot), and the check of the experiment's
chat template against that model at the start of each sampling stage (G-chat-template)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from rlvr_core.core import hub
from rlvr_core.core.numerics import numerics
from rlvr_core.core.progress import SILENT, Progress
from rlvr_core.data.templates import get_template, require_template_for_model
from rlvr_core.experiment.config import ExperimentConfig
from rlvr_core.pipeline.cache import cached_dir
from rlvr_core.pipeline.stage_outputs import DataArtifact, ModelArtifact
from rlvr_core.sampling.models import model_hashes
from rlvr_core.tiny.spec import WarmStartSpec

# Bump when the stage's code changes what it produces, so stale cache entries are not reused.
WARMSTART_STAGE_VERSION = "1"


def warm_start_spec(cfg: ExperimentConfig) -> WarmStartSpec:
    m = cfg.model
    return WarmStartSpec(steps=m.warm_start.steps, batch_size=m.warm_start.batch_size, lr=m.warm_start.lr,
                         seed=m.warm_start.seed, vocab_size=m.tiny.vocab_size, hidden_size=m.tiny.hidden_size,
                         num_layers=m.tiny.num_layers, heads=m.tiny.num_heads,
                         teacher_sub_as_add=m.warm_start.teacher_sub_as_add,
                         teacher_stops_early=m.warm_start.teacher_stops_early,
                         teacher_tool_share=m.warm_start.teacher_tool_share)


def prepare_base_model(cfg: ExperimentConfig, data: DataArtifact, progress: Progress = SILENT) -> ModelArtifact:
    """Warm-start the tiny base model (cached on data + spec), or point at a local HF model."""
    ref = cfg.model.hub_ref()
    if ref is not None:  # the Hugging Face cache first, then a download (unless HF_HUB_OFFLINE)
        snap = hub.snapshot(ref[0], revision=ref[1])
        mh, th = model_hashes(snap.folder)
        progress("model", f"{snap.repo} at commit {snap.commit} ({snap.folder})")
        return ModelArtifact(str(snap.folder), f"{snap.repo}@{snap.commit}", mh, th, cached=True,
                             info={"hub": snap.record()})
    if cfg.model.source == "hf":
        path = Path(cfg.model.path).expanduser().resolve()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model.path {path} has no config.json (a local Hugging Face model directory)")
        mh, th = model_hashes(path)
        return ModelArtifact(str(path), path.name, mh, th, cached=True)

    spec = warm_start_spec(cfg)
    template = get_template(cfg.prompt.template)
    spec_key = asdict(spec)
    if not spec.teacher_tool_share:  # a key from before the option (its default) stays the same key
        del spec_key["teacher_tool_share"]
    else:  # tool answers and in-head guesses are context, not labels (`warmstart._segments`)
        spec_key["untrained"] = "tool answers, head digits"
    key = {"stage": WARMSTART_STAGE_VERSION, "data": data.train_hash, "spec": spec_key, "template": template.key,
           "numerics": numerics()}
    report = progress.counter("warm-start", "step")

    def build(tmp: Path) -> None:
        from rlvr_core.tiny.warmstart import warm_start  # torch and transformers: only when it trains

        warm_start(data.train_rows(), tmp, spec, template_id=template.id,
                   progress=lambda step, total, loss: report(step, total, loss))

    folder, hit = cached_dir("base_model", key, build)
    info = json.loads((folder / "warmstart.json").read_text()) if (folder / "warmstart.json").exists() else {}
    mh, th = model_hashes(folder)
    progress("warm-start", f"base model {folder.name} ({'cached' if hit else 'trained'})")
    return ModelArtifact(str(folder), f"tiny-{folder.name}", mh, th, hit, info)


def check_template_at_start(cfg: ExperimentConfig, model_path: str, progress: Progress = SILENT,
                            stage: str = "template") -> list[str]:
    """G-chat-template at the start of a sampling stage: the experiment's template against `model.kind` and the
    model's own tokenizer (`require_template_for_model`). A finding that means garbage from the first prompt
    raises `TemplateError` before anything is sampled; the warnings are logged and returned for the summary."""
    from transformers import AutoTokenizer

    if not Path(model_path).is_dir():  # transformers would read a missing folder as a hub repo id
        raise FileNotFoundError(f"{stage}: model folder {model_path} does not exist")
    tok = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    warnings = require_template_for_model(get_template(cfg.prompt.template), cfg.model.kind, tok,
                                          allow_kind_mismatch=cfg.prompt.allow_kind_mismatch)
    for w in warnings:
        progress(stage, f"warning: {w}")
    return warnings
