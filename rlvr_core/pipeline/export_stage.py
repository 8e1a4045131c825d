"""The export stage: the training run's last DeepSpeed checkpoint as a safetensors folder, uploaded to the artifact
store and verified there file by file (G-lost-ckpt: a checkpoint only counts once exported and verified)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr_core.artifacts.export import MANIFEST_FILE, export_checkpoint, upload_export, verify_local_export
from rlvr_core.core.manifest import file_sha256
from rlvr_core.core.progress import SILENT, Progress
from rlvr_core.pipeline.stage_outputs import ModelArtifact
from rlvr_core.pipeline.train_stage import TrainArtifact
from rlvr_core.sampling.models import model_hashes


@dataclass(frozen=True)
class ExportArtifact:
    model: ModelArtifact  # the exported, verified folder (from_pretrained-loadable)
    uri: str  # where it was uploaded and verified in the artifact store
    step: int
    dtype: str
    manifest_sha256: str


def export_stage(trained: TrainArtifact, base: ModelArtifact, store: Any, prefix: str, *, dtype: str = "float32",
                 run_manifest: dict[str, Any] | None = None, progress: Progress = SILENT) -> ExportArtifact:
    """Export the training run's last DeepSpeed checkpoint to safetensors, upload it under `prefix`
    and verify every checksum there (G-lost-ckpt: a checkpoint only counts once exported and verified).

    The local export sits in the training stage's folder and is reused when its files still match its
    manifest; the upload is verified every time.
    """
    local = Path(trained.folder) / f"export-{dtype}"
    try:
        verify_local_export(local)
        progress("export", f"reusing the verified export in {local}")
    except Exception:  # noqa: BLE001 — absent, partial or damaged: export again
        export_checkpoint(Path(trained.folder) / "checkpoints", base_model_dir=base.path, out_dir=local,
                          dtype=dtype, run_manifest=run_manifest, overwrite=True,
                          train_template=trained.summary.get("prompt_template"))
    manifest = json.loads((local / MANIFEST_FILE).read_text())
    upload_export(local, store, prefix)
    mh, th = model_hashes(local)
    progress("export", f"step {manifest['step']} {dtype} exported, uploaded and verified at {store.url(prefix)}")
    return ExportArtifact(ModelArtifact(str(local), f"{trained.model.model_id}-export", mh, th, trained.cached),
                          store.url(prefix), int(manifest["step"]), dtype, file_sha256(local / MANIFEST_FILE))
