"""The trainer's half of a `vllm-server` weight push, timed on the device the policy trains on.

Why: a push to `vllm serve` (rlvr_core/grpo/server_rollout.py) has two halves: rank 0 turns the policy's
weights into a version (the `file` backend: gather under ZeRO-3, copy device -> host, one safetensors file
written and renamed; the staleness path first snapshots the weights to host memory), then each server loads
it. The server half needs vLLM on the device, which the lent GPU machines cannot run (their torch is older
than vLLM's pin; ../shared/STACK.md); the trainer half needs only torch, DeepSpeed and safetensors, so it is
measured here at a real model size, on the real DeepSpeed policy, after real optimizer steps.

For each ZeRO stage in --zero-stages: the policy of `bench_gpu_grpo.build_train_only_policy` (bf16 on the
device, fp32 master weights, AdamW), then --versions versions, an update_policy step between two versions:
  sync_s      on-policy push, writer half: `write_version_file(folder, v, engine_weights(module))` inside
              the ZeRO-3 gather of `policy.current_weights()`, as `VLLMServerRolloutEngine.sync` runs it
  snapshot_s  staleness path: the trainer's `_snapshot` (`policy.full_weights(everywhere=True)`, device ->
              host copies)
  write_s     the snapshot written as a version file (the ahead thread's `load`)
Each version file is read back and checked bit for bit against the snapshot (every weight, tied lm_head
included), must hold at least the model's N weights (a ZeRO-3 weight written while partitioned is empty),
and must differ from the version before (the step moved the weights).

  python benchmarks/bench_push_gpu.py --shape qwen2.5-0.5b --json $OUT/push.json      # one GPU
  python benchmarks/bench_push_gpu.py --shape tiny --allow-cpu --versions 2           # CPU dry run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gpu_grpo as g  # noqa: E402  (the shapes, tokenizer, model and policy builders)


def _sync(cuda: bool) -> None:
    import torch

    if cuda:
        torch.cuda.synchronize()


def one_version(policy, folder: Path, v: int, cuda: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Version v through both push paths, timed, and read back: (its record, the host snapshot of the weights)."""
    from safetensors.torch import load_file

    from rlvr_core.grpo.vllm_rollout import gathered_whole, engine_weights
    from rlvr_core.sampling.weight_push.file import write_version_file

    _sync(cuda)
    t0 = time.perf_counter()
    module = policy.current_weights()  # what the rollouts' sync gets (trainer.py: weights=policy.current_weights)
    with gathered_whole(module):
        path, nbytes = write_version_file(folder / "sync", v, engine_weights(module))
    t1 = time.perf_counter()
    with policy.full_weights(everywhere=True) as full:  # trainer._snapshot -> VLLMServerRolloutEngine.snapshot
        snap = {k: t.detach().to("cpu", copy=True) for k, t in engine_weights(full)}
    _sync(cuda)
    t2 = time.perf_counter()
    spath, _ = write_version_file(folder / "stale", v, iter(snap.items()))
    t3 = time.perf_counter()
    got, got_stale = load_file(str(path)), load_file(str(spath))
    bad = [k for k in snap if not (_same(got.get(k), snap[k]) and _same(got_stale.get(k), snap[k]))]
    if bad or set(got) != set(snap):
        raise RuntimeError(f"version {v}: the file differs from the weights at {bad[:5]} "
                           f"(keys missing: {sorted(set(snap) - set(got))[:5]})")
    return {"version": v, "bytes": nbytes, "sync_s": t1 - t0, "snapshot_s": t2 - t1, "write_s": t3 - t2,
            "tensors": len(got), "numel": sum(t.numel() for t in got.values())}, snap


def _same(a, b) -> bool:
    """`a` (read back; None if missing) is `b` exactly: dtype, shape and every bit."""
    import torch

    return a is not None and a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def run_stage(zero: int, a: argparse.Namespace, tok, rows, device: str, work: Path) -> dict[str, Any]:
    import torch

    from rlvr_core.experiment.config import GRPOConfig

    cuda = device == "cuda"
    cfg = GRPOConfig(enabled=True, steps=a.versions, prompts_per_step=a.prompts_per_step, group_size=a.group_size,
                     lr=1e-4, warmup_steps=0, zero_stage=zero, precision="bf16", checkpoint_every=10**6,
                     rollout_samples_per_step=0)
    model, facts = g.build_model(a.shape, tok, device)
    policy = g.build_train_only_policy(model, cfg, batch_size=a.prompts_per_step * a.group_size, world=1)
    del model
    recs, prev = [], None
    for v in range(a.versions):
        if v:
            g.train_only_steps(policy, cfg, tok, rows, facts["n_params"], steps=1, T=a.max_new_tokens, rank=0,
                               world=1, peak=None, ckpt=False)
        rec, snap = one_version(policy, work / f"z{zero}", v, cuda)
        if rec["numel"] < facts["n_params"]:  # a ZeRO-3 weight written while partitioned has numel 0
            raise RuntimeError(f"ZeRO-{zero}: version {v} holds {rec['numel']:,} weights of {facts['n_params']:,}")
        if prev is not None:
            moved = sum(int(not torch.equal(snap[k], prev[k])) for k in snap)
            if not moved:
                raise RuntimeError(f"ZeRO-{zero}: version {v} equals version {v - 1}: the step moved no weight")
            rec["tensors_changed"] = moved
        prev = snap
        recs.append(rec)
        print(f"  ZeRO-{zero} v{v}: {rec['bytes'] / 2**30:.2f} GiB, sync {rec['sync_s']:.2f} s, snapshot "
              f"{rec['snapshot_s']:.2f} s + write {rec['write_s']:.2f} s", flush=True)
    del policy
    if cuda:
        torch.cuda.empty_cache()
    timed = recs[1:] or recs  # version 0 pays first-touch costs (page cache, pinned pages)
    med = {k: statistics.median(r[k] for r in timed) for k in ("sync_s", "snapshot_s", "write_s")}
    return {"zero_stage": zero, "n_params": facts["n_params"], "bytes": recs[0]["bytes"], "versions": recs,
            "median": med, "sync_gib_per_s": recs[0]["bytes"] / 2**30 / med["sync_s"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(g.SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--zero-stages", default="2,3")
    ap.add_argument("--versions", type=int, default=4, help="versions pushed per stage (a train step between two)")
    ap.add_argument("--prompts-per-step", "-P", type=int, default=4)
    ap.add_argument("--group-size", "-G", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--allow-cpu", action="store_true", help="run without CUDA (any shape; slow)")
    ap.add_argument("--work", type=Path, default=None, help="where version files go (default: a temporary folder)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not a.allow_cpu:
        print("no GPU visible: pass --allow-cpu (and --shape tiny) for a CPU run", file=sys.stderr)
        return 2
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")
    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset

    rows = make_synthetic_dataset(SyntheticSpec(n_train=64, n_test=8, seed=g.SEED))["train"]
    tok = g.build_tokenizer(a.shape, rows)
    device = "cuda" if cuda else "cpu"
    with tempfile.TemporaryDirectory(prefix="bench-push-", dir=a.work) as tmp:
        stages = [run_stage(int(z), a, tok, rows, device, Path(tmp)) for z in a.zero_stages.split(",")]
    result = {"shape": a.shape, "device": torch.cuda.get_device_name() if cuda else "cpu",
              "settings": {"precision": "bf16", "versions": a.versions, "P": a.prompts_per_step, "G": a.group_size,
                           "max_new_tokens": a.max_new_tokens, "work": str(a.work or tempfile.gettempdir())},
              "versions_installed": g._versions(), "stages": stages}
    for s in stages:
        m = s["median"]
        print(f"ZeRO-{s['zero_stage']}: N = {s['n_params']:,}, version file {s['bytes'] / 2**30:.2f} GiB; median over "
              f"versions 1..: on-policy push (writer) {m['sync_s']:.2f} s ({s['sync_gib_per_s']:.2f} GiB/s), "
              f"staleness snapshot {m['snapshot_s']:.2f} s + write {m['write_s']:.2f} s")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
