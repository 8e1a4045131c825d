"""On-policy distillation (rlvr_core/grpo/distillation.py): both reverse-KL estimators against TRL's own code, the
teacher found by folder, run id and hub id from local files only, a teacher of another tokenizer refused before any
model loads, and the trainer distilling the tiny model (G-teacher-kl planted and not). The teacher on a vLLM server
is tested in test_vllm_server.py.

The references are TRL 1.16's two distillation losses. The full estimator: DistillationTrainer's
`trl.trainer.distillation_trainer._chunked_divergence_loss` with beta = 1 (reverse KL), which takes the student's
and the teacher's final hidden states and output-head weights, so both sides get the same logits (hidden @ W^T).
The sampled estimator: ServerDistillationTrainer's `_compute_server_sparse_top_1_divergence_loss` (beta = 1,
loss_top_k = 1, reverse_kl_top_1_mode "sampled", loss_add_tail: its defaults with beta = 1), called as a plain
function on an object holding those four settings (building the trainer needs a model, a dataset and a running
teacher server; the method reads nothing else), on the teacher log-probs its server fetch produces (-inf past each
completion). Gradients are compared w.r.t. the student's hidden states and head weight. TRL computes in float32
whatever the input, hence float32 here; equality to 1e-6 (absolute and relative).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import torch

from grpo_helpers import VERIFIER, tiny_cfg
from rlvr_core.experiment.config import ConfigError, RewardConfig
from rlvr_core.grpo import trainer as trainer_mod
from rlvr_core.grpo.distillation import (check_same_tokenizer, distillation_loss, resolve_teacher,
                                         reverse_kl_tokens, sampled_reverse_kl_tokens, score_kl_tokens)

trl_distill = pytest.importorskip("trl.trainer.distillation_trainer",
                                  reason="TRL is not installed: the cross-check against TRL's loss needs it")

B, T, H, V = 4, 6, 8, 13
MASKS = {
    "ragged": [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]],
    "fully_masked_rows": [[1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]],
    "all_masked": [[0] * T] * B,
}


def _tensors(seed: int):
    g = torch.Generator().manual_seed(seed)
    hs = torch.randn(B, T, H, generator=g).requires_grad_(True)
    ws = (torch.randn(V, H, generator=g) * 0.7).requires_grad_(True)
    return hs, ws, torch.randn(B, T, H, generator=g), torch.randn(V, H, generator=g) * 0.7


def _ours(hs, ws, ht, wt, mask, **kw):
    return distillation_loss(torch.log_softmax(hs @ ws.T, -1), torch.log_softmax(ht @ wt.T, -1), mask, **kw)[0]


@pytest.mark.parametrize("masks", sorted(MASKS))
@pytest.mark.parametrize("seed", [0, 1])
def test_reverse_kl_loss_and_gradients_equal_trl(masks, seed):
    hs, ws, ht, wt = _tensors(seed)
    mask = torch.tensor(MASKS[masks])
    theirs, _, n = trl_distill._chunked_divergence_loss(hs, ht, ws, wt, mask, 1.0)
    ours = _ours(hs, ws, ht, wt, mask.bool())
    assert int(n) == int(mask.sum())
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
    for a, b in zip(torch.autograd.grad(ours, (hs, ws), allow_unused=True),
                    torch.autograd.grad(theirs, (hs, ws), allow_unused=True)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    if masks == "all_masked":  # no token: loss 0 and every gradient exactly 0, on both sides
        assert float(ours) == 0.0


def _trl_sampled(student_all: torch.Tensor, teacher_all: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor):
    """TRL's server-distillation loss (beta 1, top-1 sampled support, tail bucket) on these log-softmaxes."""
    from trl.experimental.server_distillation.server_distillation_trainer import ServerDistillationTrainer as S

    m = mask.bool()
    top1 = teacher_all.max(-1)
    fetched = {"actual_logprobs": torch.where(m, teacher_all.gather(-1, tokens[..., None])[..., 0], -math.inf),
               "topk_logprobs": top1.values[..., None], "topk_token_ids": top1.indices[..., None]}
    me = SimpleNamespace(beta=1.0, loss_add_tail=True, reverse_kl_top_1_mode="sampled",
                         _reduce_divergence_loss=S._reduce_divergence_loss)
    me._get_reverse_kl_top_1_tokens = partial(S._get_reverse_kl_top_1_tokens, me)
    me._compute_sparse_top_1_divergence_loss = partial(S._compute_sparse_top_1_divergence_loss, me)
    return S._compute_server_sparse_top_1_divergence_loss(me, fetched, student_all, tokens,
                                                          torch.where(m, tokens, torch.full_like(tokens, -100)))


@pytest.mark.parametrize("masks", sorted(MASKS))
@pytest.mark.parametrize("seed", [0, 1])
def test_sampled_reverse_kl_loss_and_gradients_equal_trls_server_distillation(masks, seed):
    hs, ws, ht, wt = _tensors(seed)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed + 10))
    mask = torch.tensor(MASKS[masks]).bool()
    s_all, t_all = torch.log_softmax(hs @ ws.T, -1), torch.log_softmax(ht @ wt.T, -1)
    theirs = _trl_sampled(s_all, t_all, tokens, mask)
    pick = lambda x: x.gather(-1, tokens[..., None])[..., 0]  # noqa: E731 - the sampled tokens' log-probs
    ours = distillation_loss(pick(s_all), pick(t_all), mask, estimator="sampled")[0]
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
    for a, b in zip(torch.autograd.grad(ours, (hs, ws), allow_unused=True, retain_graph=True),
                    torch.autograd.grad(theirs, (hs, ws), allow_unused=True)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    if masks == "all_masked":
        assert float(ours) == 0.0


def test_the_sampled_kl_is_the_two_outcome_kl_a_lower_bound_of_the_full_one():
    # Hand-worked: p = 0.5, q = 0.25 -> 0.5 log 2 + 0.5 log(0.5 / 0.75). On random distributions: never above the
    # full KL at its position, 0 where student and teacher agree on the sampled token, padding never reaches it.
    two = sampled_reverse_kl_tokens(torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]]),
                                    torch.ones(1, 1, dtype=torch.bool))
    assert float(two) == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75), abs=1e-7)
    hs, ws, ht, wt = _tensors(4)
    s, t = torch.log_softmax(hs @ ws.T, -1), torch.log_softmax(ht @ wt.T, -1)
    mask = torch.tensor(MASKS["ragged"]).bool()
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(4))
    pick = lambda x: x.gather(-1, tokens[..., None])[..., 0]  # noqa: E731
    sampled, full = sampled_reverse_kl_tokens(pick(s), pick(t), mask), reverse_kl_tokens(s, t, mask)
    assert bool((sampled <= full + 1e-6).all()) and float(sampled[mask].min()) > 0
    assert float(sampled_reverse_kl_tokens(pick(s), pick(s).detach(), mask).abs().max()) < 1e-6
    bad = torch.where(mask, pick(s), torch.full_like(pick(s), math.nan))
    loss, _ = distillation_loss(bad, torch.where(mask, pick(t), math.inf), mask, estimator="sampled")
    torch.testing.assert_close(loss, distillation_loss(pick(s), pick(t), mask, estimator="sampled")[0])
    assert torch.isfinite(torch.autograd.grad(loss, hs)[0]).all()


def test_the_score_estimators_expected_gradient_is_the_full_kls_summed_over_every_token():
    # TRL has no score-function loss; the reference is the closed form. At each position, sum the score loss's
    # gradient over every token v the student could have sampled, weighted by p_s(v): by the score-function
    # identity that is the gradient of the full KL at that position (the full estimator, itself equal to TRL's).
    # float64, so the identity holds to 1e-10. Its value is k1 = log p_s(v) - log p_t(v), whose p_s-weighted sum is
    # the full KL; padding (nan/inf there) reaches neither.
    hs, ws, ht, wt = (x.double().detach() for x in _tensors(5))
    hs.requires_grad_(True), ws.requires_grad_(True)
    mask = torch.tensor(MASKS["ragged"]).bool()
    s_all, t_all = torch.log_softmax(hs @ ws.T, -1), torch.log_softmax(ht @ wt.T, -1)
    want = torch.autograd.grad(reverse_kl_tokens(s_all, t_all, mask).sum(), (hs, ws), retain_graph=True)
    expected, value = 0.0, torch.zeros(B, T, dtype=torch.float64)
    for v in range(V):
        k = score_kl_tokens(s_all[..., v], t_all[..., v], mask)
        weight = s_all[..., v].exp().detach()
        expected = expected + (weight * k).sum()
        value = value + weight * k.detach()
    got = torch.autograd.grad(expected, (hs, ws), retain_graph=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(value, reverse_kl_tokens(s_all, t_all, mask).detach(), atol=1e-12, rtol=1e-12)
    tokens = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(5))
    pick = lambda x: x.gather(-1, tokens[..., None])[..., 0]  # noqa: E731
    loss, met = distillation_loss(torch.where(mask, pick(s_all), math.nan), torch.where(mask, pick(t_all), math.inf),
                                  mask, estimator="score")
    torch.testing.assert_close(loss, (pick(s_all) - pick(t_all))[mask].mean())
    assert float(met["distill/kl_k1_mean"]) == pytest.approx(float(loss)) and torch.isfinite(
        torch.autograd.grad(loss, hs)[0]).all()


def test_micro_batches_add_up_like_trls_num_items_in_batch():
    # Split into two micro-batches with the step's token count as the normaliser (TRL's num_items_in_batch, our
    # num_tokens): the two losses and their gradients add up to TRL's whole-batch ones.
    hs, ws, ht, wt = _tensors(2)
    mask = torch.tensor(MASKS["fully_masked_rows"])
    n = float(mask.sum())
    whole, _, _ = trl_distill._chunked_divergence_loss(hs, ht, ws, wt, mask, 1.0)
    parts = sum(_ours(hs[i:i + 2], ws, ht[i:i + 2], wt, mask[i:i + 2].bool(), num_tokens=n) for i in (0, 2))
    torch.testing.assert_close(parts, whole, atol=1e-6, rtol=1e-6)
    for a, b in zip(torch.autograd.grad(parts, (hs, ws)), torch.autograd.grad(whole, (hs, ws))):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_the_kl_is_exact_and_padding_never_reaches_it():
    # Per token, the written-out sum_v p_s (log p_s - log p_t); equal distributions give 0; inf/nan in the padding
    # of either side change neither the loss nor the gradient.
    hs, ws, ht, wt = _tensors(3)
    s, t = torch.log_softmax(hs @ ws.T, -1), torch.log_softmax(ht @ wt.T, -1)
    mask = torch.tensor(MASKS["ragged"]).bool()
    kl = reverse_kl_tokens(s, t, mask)
    want = (s.exp() * (s - t)).sum(-1) * mask
    torch.testing.assert_close(kl, want, atol=1e-6, rtol=1e-6)
    assert float(reverse_kl_tokens(s, s.detach(), mask).abs().max()) < 1e-6
    bad_s = torch.where(mask[..., None], s, torch.full_like(s, float("nan")))
    bad_t = torch.where(mask[..., None], t, torch.full_like(t, float("inf")))
    loss, met = distillation_loss(bad_s, bad_t, mask)
    clean, _ = distillation_loss(s, t, mask)
    torch.testing.assert_close(loss, clean)
    g = torch.autograd.grad(loss, hs)[0]
    assert torch.isfinite(g).all()
    assert met["distill/kl_max"] == pytest.approx(float(want.max()), abs=1e-5)
    assert math.isnan(float(distillation_loss(s, t, torch.zeros_like(mask))[1]["distill/kl_mean"]))


# ------------------------------------------------------------------------------------------- the config
def test_the_config_fields_validate_and_stay_out_of_the_default_key():
    from rlvr_core.experiment.config import parse_config
    from rlvr_core.experiment.grpo_config import grpo_key_dump

    default = grpo_key_dump(parse_config({"grpo": {"enabled": True}}).grpo)
    assert not [k for k in default if k.startswith("distill") or k == "teacher_kl_max"]
    on = parse_config({"grpo": {"enabled": True, "distill_teacher": "run:abcdef12", "distill_weight": 0.5,
                                "guards": {"teacher_kl_max": 4.0}}}).grpo
    key = grpo_key_dump(on)
    assert (key["distill_teacher"], key["distill_weight"], key["teacher_kl_max"]) == ("run:abcdef12", 0.5, 4.0)
    assert "distill_teacher_revision" not in key and "distill_estimator" not in key  # full: today's default
    served = parse_config({"grpo": {"enabled": True, "distill_teacher": "t",
                                    "distill_teacher_servers": ["http://h:8000"]}}).grpo
    key = grpo_key_dump(served)  # a server scores the sampled tokens only: the estimator follows, and is recorded
    assert (key["distill_estimator"], key["distill_teacher_servers"]) == ("sampled", ["http://h:8000"])
    assert parse_config({"grpo": {"enabled": True, "distill_teacher": "t", "distill_estimator": "score",
                                  "distill_teacher_servers": ["http://h:8000"]}}).grpo.distill_estimator == "score"
    bad = [({"distill_weight": 0.5}, "distill_weight / distill_teacher_revision / distill_estimator / "
                                     "distill_teacher_servers need distill_teacher"),
           ({"distill_estimator": "sampled"}, "need distill_teacher"),
           ({"distill_teacher": "t", "distill_estimator": "topk"}, "distill_estimator: Input should be 'full', "
                                                                   "'sampled' or 'score'"),
           ({"distill_teacher": "t", "distill_teacher_servers": ["h:8000"]}, "'h:8000' is not an http"),
           ({"distill_teacher": "t", "distill_teacher_servers": ["http://h:8000"], "distill_estimator": "full"},
            "distill_teacher_servers give the teacher's log-probs of the sampled tokens only"),
           ({"distill_teacher": "t", "distill_weight": 1.5}, "distill_weight: Input should be less than or "
                                                                "equal to 1"),
           ({"distill_teacher": "run:"}, "distill_teacher run:<run id> names no run"),
           ({"distill_teacher": "run:abcdef12", "distill_teacher_revision": "main"}, "distill_teacher_revision is "
                                                                                      "for a hub id"),
           ({"distill_teacher": "t", "guards": {"teacher_kl_max": 0}}, "guards.teacher_kl_max")]
    for grpo, msg in bad:
        with pytest.raises(ConfigError, match=r"exp.yaml: grpo[.:].*" + msg.replace("(", r"\(").replace("/", ".")):
            parse_config({"grpo": grpo}, "exp.yaml")


# ------------------------------------------------------------------------------------------- finding the teacher
def _hub_cache(cache: Path, repo: str, commit: str, files: list[Path]) -> None:
    """`<cache>/models--org--name` as huggingface_hub lays it out: blobs, snapshots/<commit>/ links, refs/main."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "blobs").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in files:
        sha = hashlib.sha256(f.read_bytes()).hexdigest()
        (root / "blobs" / sha).write_bytes(f.read_bytes())
        (snap / f.name).symlink_to(os.path.relpath(root / "blobs" / sha, snap))


def _export(store_root: Path, folder: str, run_id: str, model_dir: Path) -> None:
    """An rlvr run folder with run.json and a verified export at checkpoints/final (manifest of every file)."""
    from rlvr_core.artifacts.export import MANIFEST_FILE

    run = store_root / folder
    final = run / "checkpoints" / "final"
    shutil.copytree(model_dir, final)
    files = [{"path": p.name, "size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in sorted(final.iterdir())]
    (final / MANIFEST_FILE).write_text(json.dumps({"kind": "rlvr.checkpoint_export", "files": files, "step": 3}))
    (run / "run.json").write_text(json.dumps({"run_id": run_id}))


def test_the_teacher_is_found_by_folder_run_id_and_hub_id_from_local_files(tiny, tmp_path, monkeypatch):
    from rlvr_core.artifacts.storage import LocalStore

    model_dir = Path(tiny[0])
    assert resolve_teacher(str(model_dir), cache_dir=tmp_path / "c") == model_dir
    _export(tmp_path / "store", "exp/demo-abcdef12", "abcdef1234567890", model_dir)
    store = LocalStore(tmp_path / "store")
    got = resolve_teacher("run:abcdef12", cache_dir=tmp_path / "c", store=store)
    assert got.parent == tmp_path / "c"
    assert (got / "config.json").read_bytes() == (model_dir / "config.json").read_bytes()
    commit = "0123456789abcdef0123456789abcdef01234567"
    _hub_cache(tmp_path / "hf", "org/teacher", commit, [p for p in model_dir.iterdir() if p.is_file()])
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # still nothing downloaded: the teacher is read from the cache only
    hub = resolve_teacher("org/teacher", commit, cache_dir=tmp_path / "c")
    assert hub.name == commit and (hub / "config.json").is_file()
    with pytest.raises(ConfigError, match=r"grpo.distill_teacher: teacher 'org/missing' not found: .*rlvr pull"):
        resolve_teacher("org/missing", cache_dir=tmp_path / "c")
    with pytest.raises(ConfigError, match=r"grpo.distill_teacher: teacher 'run:ffffffff' not found"):
        resolve_teacher("run:ffffffff", cache_dir=tmp_path / "c", store=store)
    with pytest.raises(ConfigError, match=r"grpo.distill_teacher: teacher .* is not a model folder"):
        resolve_teacher(str(tmp_path), cache_dir=tmp_path / "c")


def test_a_teacher_of_another_tokenizer_is_refused_before_any_model_loads(tiny, tmp_path):
    model_dir, rows, ids = tiny
    other = tmp_path / "other"
    shutil.copytree(model_dir, other)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(other)
    check_same_tokenizer(model_dir, model_dir)  # the same: accepted
    with pytest.raises(ConfigError, match=r"other vs .*: grpo.distill_teacher: the teacher's tokenizer is not the "
                                          r"student's: the vocabularies differ"):
        trainer_mod.train_grpo(model_dir, rows, ids, tmp_path / "run", tiny_cfg(distill_teacher=str(other)),
                               template_id="qa", reward=RewardConfig(verifier=VERIFIER), max_new_tokens=12, seed=0)
    assert not (tmp_path / "run").exists()  # nothing written, no model loaded, no verifier started
    # The pipeline flow checks the same right after its base-model stage, before the pass rates.
    from rlvr_core.experiment.config import parse_config
    from rlvr_core.pipeline.stages import ModelArtifact, teacher_before_training

    base = ModelArtifact(str(model_dir), "tiny", "h", "t", True)
    cfg = parse_config({"grpo": {"enabled": True, "distill_teacher": str(other)}})
    with pytest.raises(ConfigError, match=r"grpo.distill_teacher: the teacher's tokenizer is not the student's"):
        teacher_before_training(cfg, base)
    teacher_before_training(parse_config({"grpo": {"enabled": True, "distill_teacher": str(model_dir)}}), base)
    # A teacher server that does not answer (a port nothing listens on): refused in both places, naming the field.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    down = r"grpo.distill_teacher_servers: the teacher server http://127.0.0.1:\d+ does not answer /health"
    with pytest.raises(ConfigError, match=down):
        trainer_mod.train_grpo(model_dir, rows, ids, tmp_path / "run", tiny_cfg(
            distill_teacher=str(model_dir), distill_teacher_servers=[dead]), template_id="qa",
            reward=RewardConfig(verifier=VERIFIER), max_new_tokens=12, seed=0)
    assert not (tmp_path / "run" / "steps.parquet").exists()
    with pytest.raises(ConfigError, match=down):
        teacher_before_training(parse_config({"grpo": {"enabled": True, "distill_teacher": str(model_dir),
                                                       "distill_teacher_servers": [dead]}}), base)
    import pickle

    with pytest.raises(ConfigError) as err:
        check_same_tokenizer(model_dir, other)
    assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)  # a stage's persisted failure keeps it


# ------------------------------------------------------------------------------------------- through the trainer
def _run(tiny, out: Path, cfg):
    model_dir, rows, ids = tiny
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = trainer_mod.train_grpo(model_dir, rows, ids, out, cfg, template_id="qa",
                                     reward=RewardConfig(verifier=VERIFIER), max_new_tokens=12, seed=0)
    finally:
        torch.set_num_threads(threads)
    return pq.read_table(res.steps_path).to_pylist()


def _perturbed(tiny, out: Path, scale: float, head_only: bool = False) -> Path:
    """A copy of the tiny base with noise of `scale` x each weight's std added (only the output head's with
    head_only): a teacher that disagrees with the student by a chosen amount (same tokenizer, same vocabulary)."""
    from transformers import AutoModelForCausalLM

    shutil.copytree(tiny[0], out)
    model = AutoModelForCausalLM.from_pretrained(out)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        params = [model.get_output_embeddings().weight] if head_only else list(model.parameters())
        for p in params:
            p.add_(torch.randn(p.shape, generator=g) * scale * (p.std() if p.numel() > 1 else 1.0))
    model.save_pretrained(out)
    return out


def test_distillation_trains_towards_the_teacher_and_a_wild_teacher_is_flagged(tiny, tmp_path):
    # The student's own weights as teacher: KL 0 at step 1 (exactly on-policy), no flag. A teacher 1 std away:
    # distillation alone (weight 1) brings the KL on the student's samples down over 6 steps with no guard flag,
    # far below the same 6 steps with the teacher only measured (weight 0: the GRPO loss alone); mixed (weight
    # 0.5) the loss is the mix of the two terms. A teacher whose output head is scrambled (G-teacher-kl planted)
    # is flagged at every step. Seeded and on CPU: the numbers are the same on every run.
    same = _run(tiny, tmp_path / "same", tiny_cfg(steps=1, distill_teacher=str(tiny[0])))
    assert same[0]["distill/kl_mean"] == pytest.approx(0.0, abs=1e-6) and same[0]["health/G-teacher-kl"] == 0
    near = str(_perturbed(tiny, tmp_path / "near", 1.0))
    rows = _run(tiny, tmp_path / "alone", tiny_cfg(steps=6, distill_teacher=near))
    kl = [r["distill/kl_mean"] for r in rows]
    assert all(math.isfinite(k) and k > 0 for k in kl) and kl[-1] < 0.5 * kl[0], kl
    assert all(r["loss"] == pytest.approx(r["distill/loss"], rel=1e-5) for r in rows)
    assert not any(v for r in rows for k, v in r.items() if k.startswith("health/")), rows
    measured = _run(tiny, tmp_path / "measured", tiny_cfg(steps=6, distill_teacher=near, distill_weight=0.0))
    assert measured[0]["distill/kl_mean"] == pytest.approx(kl[0], rel=1e-5)  # the same first samples
    assert min(r["distill/kl_mean"] for r in measured[3:]) > 2 * max(kl[3:]), (measured, kl)
    # The sampled estimator (what a teacher server gives) on the same first samples: at most the full KL (here
    # ~1/50 of it: the tiny model spreads its mass, so p and q of one token are both small), while its k1 column,
    # the full KL estimated from the sampled tokens, reads the full KL of those samples (0.054 vs 0.052 measured).
    # Distillation by it alone more than halves both in 8 steps: the full KL too, as the full estimator does.
    sampled = _run(tiny, tmp_path / "sampled", tiny_cfg(steps=8, distill_teacher=near, distill_estimator="sampled"))
    skl, k1 = [r["distill/kl_mean"] for r in sampled], [r["distill/kl_k1_mean"] for r in sampled]
    assert 0 < skl[0] <= kl[0] and sum(skl[-2:]) < 0.6 * sum(skl[:2]), (skl, kl)
    assert k1[0] == pytest.approx(kl[0], rel=0.2) and sum(k1[-3:]) / 3 < 0.5 * k1[0], (k1, kl)
    assert not any(v for r in sampled for k, v in r.items() if k.startswith("health/")), sampled
    # The score estimator, from the same log-probs: its value is k1 itself, the same first reading; it trains
    # without a flag. (Its one-token gradient is noisy: at this lr the tiny model's k1 wanders, 0.054 to 0.026 to
    # 0.086, over 8 steps, where the demo distils by it: docs/grpo_training.md.)
    score = _run(tiny, tmp_path / "score", tiny_cfg(steps=4, distill_teacher=near, distill_estimator="score"))
    sk = [r["distill/kl_k1_mean"] for r in score]
    assert sk[0] == pytest.approx(k1[0], rel=1e-5) and sk[1] != pytest.approx(k1[1], rel=1e-3), (sk, k1)
    assert all(r["distill/kl_mean"] == pytest.approx(r["distill/kl_k1_mean"], rel=1e-5) for r in score), score
    assert not any(v for r in score for k, v in r.items() if k.startswith("health/")), score
    mixed = _run(tiny, tmp_path / "mixed", tiny_cfg(steps=1, distill_teacher=near, distill_weight=0.5))[0]
    assert mixed["loss"] == pytest.approx(0.5 * mixed["pg_loss"] + 0.5 * mixed["distill/loss"], rel=1e-5, abs=1e-7)
    wild = _perturbed(tiny, tmp_path / "wild", 30.0, head_only=True)
    flagged = _run(tiny, tmp_path / "wild-run", tiny_cfg(steps=2, distill_teacher=str(wild)))
    assert all(r["distill/kl_mean"] > 10 and r["health/G-teacher-kl"] == 1 for r in flagged), flagged
    # With the sampled estimator the guard reads distill/kl_k1_mean, the full KL's estimate from the sampled tokens
    # (the two-outcome KL, distill/kl_mean, stays small: the student's p of the token bounds it).
    flagged = _run(tiny, tmp_path / "wild-sampled", tiny_cfg(steps=1, distill_teacher=str(wild),
                                                            distill_estimator="sampled"))
    assert all(r["distill/kl_k1_mean"] > 10 and r["health/G-teacher-kl"] == 1 for r in flagged), flagged
