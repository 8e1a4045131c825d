"""Checkpoint export: DeepSpeed ZeRO checkpoint -> Hugging Face safetensors folder, uploaded and verified.

A checkpoint only counts once it is exported and verified (BUGZOO G-lost-ckpt). Three steps, each of
which fails loudly rather than producing something half-right:

  1. `export_checkpoint(checkpoint_dir, tag, base_model_dir=..., out_dir=..., dtype=...)` consolidates
     the ZeRO 1/2/3 partitions with DeepSpeed's own `zero_to_fp32` (the fp32 master weights), copies
     them into the model class built from the base model's config (`from_config`), refusing any missing,
     unexpected or mis-shaped key, casts to `dtype`, writes `save_pretrained` (safetensors) plus the
     tokenizer and generation config, re-reads the written safetensors and compares every tensor with
     the model's, and finally writes `export_manifest.json` (run manifest, training template, step, tag,
     dtype, ZeRO stage, size and sha256 of every file). The folder is built under a temporary name and renamed
     into place, so an `out_dir` that exists holds a complete export.
  2. `upload_export(local_dir, store, prefix)` checks the local files against the manifest, uploads them
     through the ArtifactStore (local folder or S3), the manifest last, then runs `verify_export`.
  3. `verify_export(store, prefix)` streams every file listed in the uploaded manifest back and compares
     its size and sha256 with the manifest; any difference, a missing file or an unlisted file raises
     `ExportVerificationError` naming the file and both checksums.

The pipeline records an export on its MLflow export run (tags `export_uri`, `export_dtype`,
`export_manifest_sha256`: flows/pipeline.py). See docs/export.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import io
import json
import logging
import math
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr_core.artifacts.storage import ArtifactStore, LocalStore, S3Store, join
from rlvr_core.core.manifest import file_sha256, package_versions

__all__ = ["MANIFEST_FILE", "DTYPES", "ExportResult", "ExportError", "ExportVerificationError", "export_checkpoint",
           "upload_export", "verify_export", "verify_local_export", "resolve_tag",
           "train_template_of"]

log = logging.getLogger(__name__)

MANIFEST_FILE = "export_manifest.json"
MANIFEST_SCHEMA = 1
DTYPES = ("float32", "bfloat16", "float16")
_CHUNK = 1 << 20
_EXPORT_PACKAGES = ("torch", "transformers", "tokenizers", "deepspeed", "safetensors", "rlvr")


class ExportError(RuntimeError):
    """The checkpoint cannot be exported faithfully (missing/unexpected keys, shapes, values, files)."""


class ExportVerificationError(RuntimeError):
    """Files of an export differ from its manifest. `problems` lists one dict per file:
    {path, problem, expected_sha256, actual_sha256, expected_size, actual_size}."""

    def __init__(self, where: str, problems: list[dict[str, Any]]):
        self.where = where
        self.problems = problems
        lines = []
        for p in problems:
            if p["problem"] == "checksum mismatch":
                lines.append(f"  {p['path']}: checksum mismatch: expected sha256 {p['expected_sha256']} size "
                             f"{p['expected_size']}, actual sha256 {p['actual_sha256']} size {p['actual_size']}")
            elif p["problem"] == "missing":
                lines.append(f"  {p['path']}: missing (expected sha256 {p['expected_sha256']} size "
                             f"{p['expected_size']}, actual: no such file)")
            else:
                lines.append(f"  {p['path']}: {p['problem']} (actual sha256 {p['actual_sha256']} "
                             f"size {p['actual_size']})")
        super().__init__(f"export at {where} failed verification ({len(problems)} file(s)):\n" + "\n".join(lines))


@dataclass
class ExportResult:
    out_dir: Path                  # the export folder (from_pretrained-loadable)
    manifest_path: Path            # out_dir / export_manifest.json
    manifest: dict[str, Any]       # its content
    step: int
    tag: str
    dtype: str
    zero_stage: int
    files: list[dict[str, Any]] = field(default_factory=list)   # [{path, size, sha256}], manifest excluded
    wall_s: float = 0.0


# ------------------------------------------------------------------------------------------ checkpoints
def _available_tags(checkpoint_dir: Path) -> list[str]:
    return sorted(p.name for p in checkpoint_dir.iterdir() if p.is_dir()) if checkpoint_dir.is_dir() else []


def resolve_tag(checkpoint_dir: str | Path, tag: str | None = None) -> tuple[Path, str]:
    """(checkpoint_dir/tag, tag); tag None = the `latest` file. Clear FileNotFoundError naming the path."""
    ckpt = Path(checkpoint_dir)
    if not ckpt.is_dir():
        raise FileNotFoundError(f"checkpoint directory {ckpt} does not exist (no checkpoint saved?)")
    if tag is None:
        latest = ckpt / "latest"
        if not latest.is_file():
            raise FileNotFoundError(f"no 'latest' file at {latest}; pass a tag explicitly "
                                    f"(tags present: {_available_tags(ckpt) or 'none'})")
        tag = latest.read_text().strip()
        if not tag:
            raise FileNotFoundError(f"'latest' file at {latest} is empty")
    tag_dir = ckpt / tag
    if not tag_dir.is_dir():
        raise FileNotFoundError(f"checkpoint tag {tag!r} not found: {tag_dir} does not exist "
                                f"(tags present: {_available_tags(ckpt) or 'none'})")
    return tag_dir, tag


def _read_model_states(tag_dir: Path) -> dict[str, Any]:
    """The small metadata of a DeepSpeed checkpoint, from rank 0's model-states file (memory-mapped)."""
    import torch

    files = sorted(tag_dir.glob("*model_states.pt"))
    if not files:
        raise FileNotFoundError(f"{tag_dir} holds no DeepSpeed '*model_states.pt' file: not a DeepSpeed checkpoint "
                                f"(files: {sorted(p.name for p in tag_dir.iterdir()) or 'none'})")
    rank0 = [f for f in files if f.name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")]
    sd = torch.load(rank0[0] if rank0 else files[0], map_location="cpu", mmap=True, weights_only=False)
    ds_config = sd.get("ds_config") or {}
    return {
        "zero_stage": int((ds_config.get("zero_optimization") or {}).get("stage", 0)),
        "dp_world_size": sd.get("dp_world_size"),
        "ds_version": sd.get("ds_version"),
        "global_steps": sd.get("global_steps"),
        "client_step": sd.get("step"),
        "training_precision": ("bf16" if (ds_config.get("bf16") or {}).get("enabled")
                               else "fp16" if (ds_config.get("fp16") or {}).get("enabled") else "fp32"),
        "module": sd.get("module"),
        "shared_params": dict(sd.get("shared_params") or {}),
    }


def _consolidate(checkpoint_dir: Path, tag: str, tag_dir: Path, meta: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """{name: tensor-like} of full (unpartitioned) fp32 weights, and how they were obtained.

    ZeRO 1/2/3: DeepSpeed's `get_fp32_state_dict_from_zero_checkpoint` (lazy mode: ZeRO-3 tensors are
    gathered one at a time), i.e. the optimizer's fp32 master weights. ZeRO 0 has no ZeRO partitions
    (zero_to_fp32 does not apply): the engine's `module` state dict, which is what DeepSpeed itself
    loads for a stage-0 checkpoint, in the precision the module trained in.
    """
    if meta["zero_stage"] == 0:
        module = meta["module"]
        if not module:
            raise ExportError(f"ZeRO stage 0 checkpoint {tag_dir} has no 'module' state dict")
        return dict(module), "deepspeed module state dict (ZeRO stage 0: no partitions to consolidate)"
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):  # zero_to_fp32 prints progress; keep it in the log instead
            sd = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir), tag=tag, lazy_mode=True)
    except Exception as e:
        raise ExportError(f"DeepSpeed could not consolidate the ZeRO-{meta['zero_stage']} checkpoint {tag_dir}: "
                          f"{type(e).__name__}: {e}") from e
    log.debug("zero_to_fp32: %s", buf.getvalue())
    return sd, "deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint"


LORA_CONFIG = "lora_config.json"  # written into the checkpoint folder by a LoRA training run
_PEFT_PREFIX = "base_model.model."


def _merge_lora(state: dict[str, Any], lora: dict[str, Any], where: Path) -> dict[str, Any]:
    """The plain model's state dict from a peft LoRA model's: W = W_base + scale * B @ A for every adapted
    linear layer (scale = lora_alpha / r, or / sqrt(r) with rsLoRA), peft's key prefixes removed.

    Written out rather than calling peft's `merge_and_unload`, so export needs no peft model and the
    training-time merge (which does use peft) is checked against an independent computation."""
    import torch

    r = int(lora["r"])
    scale = float(lora["lora_alpha"]) / (math.sqrt(r) if lora.get("use_rslora") else r)
    out: dict[str, Any] = {}
    adapters: dict[str, tuple[str, str]] = {}
    for k in state:
        if not k.startswith(_PEFT_PREFIX):
            raise ExportError(f"{where}: LoRA checkpoint key {k!r} lacks peft's {_PEFT_PREFIX!r} prefix")
        name = k[len(_PEFT_PREFIX):]
        if ".lora_A." in name:
            module, rest = name.split(".lora_A.", 1)
            adapters[module] = (k, _PEFT_PREFIX + module + ".lora_B." + rest)
        elif ".lora_B." not in name:
            out[name.replace(".base_layer.", ".")] = state[k]
    if not adapters:
        raise ExportError(f"{where}: {LORA_CONFIG} says LoRA but the checkpoint has no lora_A weights")

    def full(t: Any) -> torch.Tensor:
        return (t if isinstance(t, torch.Tensor) else t.contiguous()).to(torch.float32)

    for module, (ka, kb) in adapters.items():
        if kb not in state or module + ".weight" not in out:
            raise ExportError(f"{where}: adapter of {module!r} is incomplete (lora_B or base weight missing)")
        out[module + ".weight"] = full(out[module + ".weight"]) + scale * (full(state[kb]) @ full(state[ka]))
    return out


def _load_into_model(model, state: dict[str, Any], source: str) -> tuple[int, list[str]]:
    """Copy every consolidated tensor into `model` (fp32) and check the match both ways.

    Fails naming the keys when the checkpoint has a key the model does not (unexpected), the model has a
    key the checkpoint does not (missing; a key that only aliases a tied parameter whose source is present
    counts as present), a shape differs, or two checkpoint keys feeding one tied parameter disagree.
    Returns the number of distinct tensors filled and the dtypes the checkpoint held them in.
    """
    import torch

    targets = model.state_dict(keep_vars=True)
    unexpected = sorted(set(state) - set(targets))
    # Tied parameters share one tensor: a model key is covered when any key sharing its tensor is loaded.
    alias_group: dict[int, list[str]] = {}
    for k, t in targets.items():
        alias_group.setdefault(id(t), []).append(k)
    missing = sorted(k for k, t in targets.items() if not any(a in state for a in alias_group[id(t)]))
    if unexpected or missing:
        raise ExportError(f"checkpoint keys do not match the model class {type(model).__name__} from the base config "
                          f"({source}): missing {missing or 'none'}; unexpected {unexpected or 'none'}")
    bad_shapes = []
    filled: dict[int, str] = {}
    with torch.no_grad():
        for k in targets:
            if k not in state:
                continue
            src = state[k]
            if tuple(src.shape) != tuple(targets[k].shape):
                bad_shapes.append(f"{k}: checkpoint {tuple(src.shape)} vs model {tuple(targets[k].shape)}")
                continue
            value = src if isinstance(src, torch.Tensor) else src.contiguous()  # ZeRO-3 lazy: gathered here
            dst = targets[k]
            if id(dst) in filled:  # a tied alias: the checkpoint's copy must hold the same values
                first = filled[id(dst)]
                if not torch.equal(dst, value.to(dst.dtype)):
                    raise ExportError(f"checkpoint keys {first!r} and {k!r} differ but the model ties them "
                                      f"(max |diff| {(dst - value.to(dst.dtype)).abs().max().item():.3g})")
                continue
            dst.copy_(value.to(dst.dtype))
            filled[id(dst)] = k
    if bad_shapes:
        raise ExportError("checkpoint tensors do not fit the model from the base config: " + "; ".join(bad_shapes))
    return len(filled), sorted({str(state[k].dtype).replace("torch.", "") for k in filled.values()})


def _list_files(root: Path) -> list[dict[str, Any]]:
    return [{"path": p.relative_to(root).as_posix(), "size": p.stat().st_size, "sha256": file_sha256(p)}
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST_FILE]


def _check_saved_weights(model, folder: Path) -> None:
    """Re-read the written safetensors and compare every tensor with the model's (exact, same dtype)."""
    import torch
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files or list(folder.glob("*.bin")):
        raise ExportError(f"save_pretrained in {folder} did not write safetensors only "
                          f"(files: {sorted(p.name for p in folder.iterdir())})")
    saved: dict[str, torch.Tensor] = {}
    for f in files:
        saved.update(load_file(f))
    targets = model.state_dict()
    alias = {}
    for k, t in targets.items():
        alias.setdefault(t.data_ptr(), []).append(k)
    unexpected = sorted(set(saved) - set(targets))
    missing = sorted(k for k, t in targets.items() if not any(a in saved for a in alias[t.data_ptr()]))
    if unexpected or missing:
        raise ExportError(f"written safetensors in {folder} do not match the model: missing {missing or 'none'}; "
                          f"unexpected {unexpected or 'none'}")
    wrong = [k for k, v in saved.items() if v.dtype != targets[k].dtype or not torch.equal(v, targets[k])]
    if wrong:
        raise ExportError(f"written safetensors in {folder} differ from the exported weights: {wrong}")


def export_checkpoint(checkpoint_dir: str | Path, tag: str | None = None, *, base_model_dir: str | Path,
                      out_dir: str | Path, dtype: str = "float32", run_manifest: dict[str, Any] | None = None,
                      train_template: str | None = None, step: int | None = None, overwrite: bool = False,
                      max_shard_size: str | int | None = None) -> ExportResult:
    """Export one DeepSpeed checkpoint (`checkpoint_dir/tag`, tag None = `latest`) as a Hugging Face folder.

    `base_model_dir` supplies config (model class via `from_config`), tokenizer and generation config.
    `dtype` is the dtype of the saved tensors ("float32", "bfloat16", "float16"); weights are the fp32
    master weights cast once. `step` defaults to the step in the checkpoint's client state (the trainer
    saves it), else DeepSpeed's global step; a `step` that contradicts the client state is refused.
    `out_dir` must not exist (or be empty) unless `overwrite`. `max_shard_size` is passed to
    `save_pretrained` (default: its own, 50GB). `train_template`: the prompt template (id@version) the run
    trained with (default: the run manifest's `prompt_template`), stored as the manifest's `train_template`
    so every evaluation of the export can compare it with its own (G-prompt-mismatch). Returns an ExportResult.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    t0 = time.perf_counter()
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} not supported: use one of {DTYPES}")
    checkpoint_dir = Path(checkpoint_dir)
    base_model_dir = Path(base_model_dir)
    out_dir = Path(out_dir)
    tag_dir, tag = resolve_tag(checkpoint_dir, tag)
    if not (base_model_dir / "config.json").is_file():
        raise FileNotFoundError(f"base model dir {base_model_dir} has no config.json")
    if out_dir.exists() and any(out_dir.iterdir()):
        if not overwrite:
            raise FileExistsError(f"export dir {out_dir} already exists and is not empty (pass overwrite=True)")

    meta = _read_model_states(tag_dir)
    step = _export_step(meta, tag, tag_dir, step)

    state, method = _consolidate(checkpoint_dir, tag, tag_dir, meta)
    meta.pop("module", None)
    lora = None
    if (checkpoint_dir / LORA_CONFIG).is_file():
        lora = json.loads((checkpoint_dir / LORA_CONFIG).read_text())
        state = _merge_lora(state, lora, tag_dir)
        method += f" + LoRA adapters merged (r={lora['r']}, alpha={lora['lora_alpha']})"

    config = AutoConfig.from_pretrained(base_model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    n_tensors, source_dtypes = _load_into_model(model, state, f"{tag_dir}, {method}")
    del state
    model = model.to(getattr(torch, dtype)).eval()
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    tok = AutoTokenizer.from_pretrained(base_model_dir, local_files_only=True)
    gen_cfg = None
    if (base_model_dir / "generation_config.json").is_file():
        gen_cfg = GenerationConfig.from_pretrained(base_model_dir, local_files_only=True)
        model.generation_config = gen_cfg

    # Build in a sibling temp folder, rename into place: an out_dir that exists is a complete export.
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _save_model(model, tok, gen_cfg, tmp, max_shard_size)
        files = _list_files(tmp)
        manifest = _export_manifest(step=step, tag=tag, dtype=dtype, meta=meta, lora=lora, method=method,
                                    checkpoint_dir=checkpoint_dir, tag_dir=tag_dir, source_dtypes=source_dtypes,
                                    model=model, base_model_dir=base_model_dir, n_params=n_params,
                                    n_tensors=n_tensors, gen_cfg=gen_cfg, run_manifest=run_manifest,
                                    train_template=train_template, files=files)
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=False, default=str) + "\n")
        if out_dir.exists():  # empty, or overwrite=True (checked above)
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(out_dir, out_dir / MANIFEST_FILE, manifest, step, tag, dtype, meta["zero_stage"], files,
                        time.perf_counter() - t0)


def _export_manifest(*, step: int, tag: str, dtype: str, meta: dict[str, Any], lora: dict[str, Any] | None,
                     method: str, checkpoint_dir: Path, tag_dir: Path, source_dtypes: Any, model, base_model_dir: Path,
                     n_params: int, n_tensors: int, gen_cfg, run_manifest: dict[str, Any] | None,
                     train_template: str | None, files: list[dict[str, Any]]) -> dict[str, Any]:
    """export_manifest.json (docs/export.md): what was exported, from which checkpoint, with which packages."""
    return {
        "schema": MANIFEST_SCHEMA,
        "kind": "rlvr.checkpoint_export",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "step": step,
        "tag": tag,
        "dtype": dtype,
        "zero_stage": meta["zero_stage"],
        "lora": lora,
        "checkpoint": {"dir": str(checkpoint_dir.resolve()), "tag_dir": str(tag_dir.resolve()),
                       "global_steps": meta["global_steps"], "client_step": meta["client_step"],
                       "dp_world_size": meta["dp_world_size"], "ds_version": meta["ds_version"],
                       "training_precision": meta["training_precision"], "consolidation": method,
                       "source_dtypes": source_dtypes},
        "model": {"class": type(model).__name__, "base_model_dir": str(base_model_dir.resolve()),
                  "n_parameters": n_params, "n_tensors": n_tensors,
                  "generation_config": gen_cfg is not None},
        "packages": package_versions(_EXPORT_PACKAGES),
        "run_manifest": run_manifest,
        "train_template": train_template or (run_manifest or {}).get("prompt_template"),
        "files": files,
    }


def _export_step(meta: dict[str, Any], tag: str, tag_dir: Path, step: int | None) -> int:
    """The export's step: the one given (refused when the client state says another), else the client
    state's, else DeepSpeed's global step, else the `step<N>` of the tag."""
    ckpt_step = meta["client_step"] if meta["client_step"] is not None else meta["global_steps"]
    if step is None:
        if ckpt_step is None:
            m = re.fullmatch(r"step(\d+)", tag)
            if not m:
                raise ValueError(f"checkpoint {tag_dir} records no step and tag {tag!r} is not 'step<N>': pass step=")
            ckpt_step = int(m.group(1))
        step = int(ckpt_step)
    elif meta["client_step"] is not None and int(meta["client_step"]) != int(step):
        raise ValueError(f"step={step} contradicts checkpoint {tag_dir}, whose client state says step "
                         f"{meta['client_step']}")
    return step


def _save_model(model, tok, gen_cfg, folder: Path, max_shard_size: str | int | None) -> None:
    """Model (safetensors, checked), tokenizer and generation config into `folder`."""
    sig = inspect.signature(model.save_pretrained).parameters
    kw: dict[str, Any] = {"safe_serialization": True} if "safe_serialization" in sig else {}
    if max_shard_size is not None:
        kw["max_shard_size"] = max_shard_size
    model.save_pretrained(folder, **kw)   # transformers >= 5 always writes safetensors (checked below)
    tok.save_pretrained(folder)
    if gen_cfg is not None and not (folder / "generation_config.json").is_file():
        gen_cfg.save_pretrained(folder)
    _check_saved_weights(model, folder)


# ------------------------------------------------------------------------------------ verification
def _read_manifest(text: str, where: str) -> dict[str, Any]:
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise ExportVerificationError(where, [{"path": MANIFEST_FILE, "problem": f"unreadable manifest ({e})",
                                               "expected_sha256": None, "actual_sha256": None,
                                               "expected_size": None, "actual_size": None}]) from e
    if manifest.get("kind") != "rlvr.checkpoint_export" or "files" not in manifest:
        raise ExportVerificationError(where, [{"path": MANIFEST_FILE, "problem": "not an export manifest",
                                               "expected_sha256": None, "actual_sha256": None,
                                               "expected_size": None, "actual_size": None}])
    return manifest


def _compare(manifest: dict[str, Any], actual: dict[str, tuple[int, str] | None],
             extra: list[tuple[str, int, str]]) -> list[dict[str, Any]]:
    problems = []
    for f in manifest["files"]:
        got = actual.get(f["path"])
        if got is None:
            problems.append({"path": f["path"], "problem": "missing", "expected_sha256": f["sha256"],
                             "actual_sha256": None, "expected_size": f["size"], "actual_size": None})
        elif got != (f["size"], f["sha256"]):
            problems.append({"path": f["path"], "problem": "checksum mismatch", "expected_sha256": f["sha256"],
                             "actual_sha256": got[1], "expected_size": f["size"], "actual_size": got[0]})
    for path, size, sha in extra:
        problems.append({"path": path, "problem": "not listed in the manifest", "expected_sha256": None,
                         "actual_sha256": sha, "expected_size": None, "actual_size": size})
    return problems


def train_template_of(model_dir: str | Path) -> str | None:
    """The prompt template (id@version) a model folder was trained with, from its `export_manifest.json`; None
    for a folder that is not our export (a base or hub model) or an export that does not record it."""
    path = Path(model_dir) / MANIFEST_FILE
    if not path.is_file():
        return None
    manifest = _read_manifest(path.read_text(), str(model_dir))
    return manifest.get("train_template") or (manifest.get("run_manifest") or {}).get("prompt_template")


def verify_local_export(local_dir: str | Path) -> dict[str, Any]:
    """Check a local export folder against its manifest (every listed file, nothing unlisted). Returns it."""
    root = Path(local_dir)
    mpath = root / MANIFEST_FILE
    if not mpath.is_file():
        raise FileNotFoundError(f"{mpath} does not exist: {root} is not a finished export")
    manifest = _read_manifest(mpath.read_text(), str(root))
    listed = {f["path"] for f in manifest["files"]}
    actual = {}
    for f in manifest["files"]:
        p = root / f["path"]
        actual[f["path"]] = (p.stat().st_size, file_sha256(p)) if p.is_file() else None
    extra = [(p.relative_to(root).as_posix(), p.stat().st_size, file_sha256(p)) for p in sorted(root.rglob("*"))
             if p.is_file() and p.name != MANIFEST_FILE and p.relative_to(root).as_posix() not in listed]
    problems = _compare(manifest, actual, extra)
    if problems:
        raise ExportVerificationError(str(root), problems)
    return manifest


def _stream_sha256(store: ArtifactStore, key: str) -> tuple[int, str] | None:
    """(size, sha256) of a stored object, read in chunks where the backend allows; None if absent."""
    h = hashlib.sha256()
    size = 0
    if isinstance(store, S3Store):
        from botocore.exceptions import ClientError

        try:
            body = store.client.get_object(Bucket=store.bucket, Key=store._key(key))["Body"]
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        for chunk in body.iter_chunks(_CHUNK):
            h.update(chunk)
            size += len(chunk)
        return size, h.hexdigest()
    if isinstance(store, LocalStore):
        p = Path(store.url(key))
        if not p.is_file():
            return None
        with open(p, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
        return size, h.hexdigest()
    try:
        data = store.get_bytes(key)
    except FileNotFoundError:
        return None
    return len(data), hashlib.sha256(data).hexdigest()


def verify_export(store: ArtifactStore, prefix: str, *, expected_manifest_sha256: str | None = None) -> dict[str, Any]:
    """Re-read every file of the export at `prefix` in `store` and compare size and sha256 with its manifest.

    Also refuses files under the prefix that the manifest does not list (e.g. a shard left by an older
    export), and, when given, a manifest whose own sha256 differs from `expected_manifest_sha256` (e.g.
    the copy logged to MLflow). Raises ExportVerificationError naming every bad file with expected and
    actual checksums; returns the manifest when everything matches.
    """
    where = store.url(prefix) if prefix.strip("/") else store.uri
    mkey = join(prefix, MANIFEST_FILE)
    try:
        mbytes = store.get_bytes(mkey)
    except FileNotFoundError:
        raise ExportVerificationError(where, [{"path": MANIFEST_FILE, "problem": "missing",
                                               "expected_sha256": expected_manifest_sha256, "actual_sha256": None,
                                               "expected_size": None, "actual_size": None}]) from None
    msha = hashlib.sha256(mbytes).hexdigest()
    if expected_manifest_sha256 is not None and msha != expected_manifest_sha256:
        raise ExportVerificationError(where, [{"path": MANIFEST_FILE, "problem": "checksum mismatch",
                                               "expected_sha256": expected_manifest_sha256, "actual_sha256": msha,
                                               "expected_size": None, "actual_size": len(mbytes)}])
    manifest = _read_manifest(mbytes.decode(), where)
    actual = {f["path"]: _stream_sha256(store, join(prefix, f["path"])) for f in manifest["files"]}
    base = prefix.strip("/")
    listed = {f["path"] for f in manifest["files"]} | {MANIFEST_FILE}
    extra = []
    for key in store.list(prefix):
        rel = key[len(base) + 1:] if base else key
        if rel not in listed:
            size, sha = _stream_sha256(store, key) or (None, None)
            extra.append((rel, size, sha))
    problems = _compare(manifest, actual, extra)
    if problems:
        raise ExportVerificationError(where, problems)
    return manifest


def upload_export(local_dir: str | Path, store: ArtifactStore, prefix: str) -> list[str]:
    """Upload an export folder to `store` under `prefix` and verify it there. Returns the uploaded keys.

    The local folder is first checked against its manifest (so a file damaged on local disk is not
    uploaded as if it were good); files go up in manifest order, the manifest last (its presence marks a
    complete upload); then `verify_export` re-reads everything from the store.
    """
    root = Path(local_dir)
    manifest = verify_local_export(root)
    keys = [store.put_file(join(prefix, f["path"]), root / f["path"]) for f in manifest["files"]]
    keys.append(store.put_file(join(prefix, MANIFEST_FILE), root / MANIFEST_FILE))
    verify_export(store, prefix, expected_manifest_sha256=file_sha256(root / MANIFEST_FILE))
    return keys
