"""On-policy distillation: a teacher scores the student's own rollouts, and the per-token reverse KL
KL(pi_student || pi_teacher) is a training signal (`grpo.distill_teacher`).

    loss  = (1 - w) * GRPO loss + w * aggregate(KL, mask)                   w = grpo.distill_weight

w = 1 trains on the teacher alone; 0 < w < 1 mixes it with the verifiable reward's policy loss. The
prefixes are the student's own samples (on-policy: Agarwal et al. 2024, "On-Policy Distillation of Language
Models", arXiv 2306.13649; Thinking Machines, "On-Policy Distillation", 2025), so the student is corrected
where it actually goes. Three estimators of the per-token KL (`grpo.distill_estimator`):

  full     KL_t = sum_v pi_s(v | prefix_t) (log pi_s(v | prefix_t) - log pi_t(v | prefix_t)), exact over the
           vocabulary. TRL 1.16's DistillationTrainer with beta = 1 (`_chunked_divergence_loss`, reverse KL,
           summed over valid tokens / their count). Needs the teacher's whole distribution: in process only.
  sampled  the same KL between the two-outcome distributions {the sampled token x_t, every other token}:
           p (log p - log q) + (1 - p) (log(1 - p) - log(1 - q)), p = pi_s(x_t), q = pi_t(x_t). Needs only the
           teacher's log-prob of the token the student sampled, which a `vllm serve` process returns as prompt
           log-probs (`grpo.distill_teacher_servers`). TRL 1.16's ServerDistillationTrainer (beta = 1,
           loss_top_k = 1, reverse_kl_top_1_mode "sampled", loss_add_tail). It is a lower bound of the full KL at
           each position (merging outcomes never raises a KL) and 0 exactly where the two agree on x_t.
  score    k1_t = log p - log q as a per-token negative reward in an on-policy policy-gradient term: value k1_t,
           gradient k1_t * grad log p. Needs what `sampled` needs; since the student sampled x_t, its expected
           gradient is exactly the full KL's (the score-function identity), at the price of variance. Thinking
           Machines' on-policy distillation (the per-token reverse KL as the advantage, discount 0); TRL has no
           such loss: tests/grpo/test_distillation.py checks it against the full KL's gradient, summed in closed
           form over every token the student could have sampled.

None is the bare sampled-token estimate log p - log q as a loss, which has zero expected gradient (`score`
adds the score-function term it lacks), nor a top-k KL, which verl reports unstable. tests/grpo/test_distillation.py
calls TRL's two losses on the same tensors (loss and gradients to 1e-6).

The teacher: a local model folder, `run:<run id>` (the exported checkpoint of an earlier rlvr run in the artifact
store, `<run folder>/checkpoints/final`, verified file by file before use), or a hub id (`org/name`, revision in
`grpo.distill_teacher_revision`) read from the Hugging Face cache only (`rlvr pull model ...` first; nothing is
downloaded while training). Its tokenizer must be the student's (`check_same_tokenizer`: same vocabulary, same
special tokens), or the config is refused before the model loads: the teacher scores the student's token ids,
which must mean the same text to both. It runs in the training process on CPU, in float32, no gradient
(`LocalTeacher`), or on `vllm serve` processes of the same model (`ServerTeacher`): then the folder is read for
its tokenizer only.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from rlvr_core.artifacts.export import verify_export, verify_local_export
from rlvr_core.artifacts.layout import resolve_run
from rlvr_core.artifacts.storage import join, open_store
from rlvr_core.core import hub
from rlvr_core.experiment.config import ConfigError
from rlvr_core.grpo.logprobs import full_vocab_logprobs
from rlvr_core.grpo.losses import get_loss_agg
from rlvr_core.sampling.vllm_client import ServerClient

__all__ = ["FIELD", "RUN_PREFIX", "ESTIMATORS", "reverse_kl_tokens", "sampled_reverse_kl_tokens", "score_kl_tokens",
           "distillation_loss", "resolve_teacher", "check_same_tokenizer", "checked_teacher", "load_teacher",
           "LocalTeacher", "ServerTeacher"]

FIELD = "grpo.distill_teacher"
SERVERS_FIELD = "grpo.distill_teacher_servers"
RUN_PREFIX = "run:"
ESTIMATORS = ("full", "sampled", "score")
SAMPLED_ONLY = ("sampled", "score")  # the estimators that need only the sampled tokens' log-probs


def reverse_kl_tokens(student_logp_all: torch.Tensor, teacher_logp_all: torch.Tensor,
                      mask: torch.Tensor) -> torch.Tensor:
    """(B, T) per-token KL(pi_s || pi_t) from (B, T, V) log-softmaxes; 0 on padding, which is replaced by 0
    before any arithmetic (both sides: the KL of two equal rows), so no padding value reaches the loss or the
    gradient. The student's side keeps its gradient; the teacher's is detached. float32 (float64 stays)."""
    if student_logp_all.shape != teacher_logp_all.shape or student_logp_all.shape[:-1] != mask.shape:
        raise ValueError(f"need student and teacher log-probs (B, T, V) of one shape and a (B, T) mask, got "
                         f"{tuple(student_logp_all.shape)}, {tuple(teacher_logp_all.shape)}, {tuple(mask.shape)}")
    m = mask.bool()
    dt = torch.float64 if student_logp_all.dtype == torch.float64 else torch.float32
    zero = torch.zeros((), dtype=dt, device=student_logp_all.device)
    s = torch.where(m[..., None], student_logp_all.to(dt), zero)
    t = torch.where(m[..., None], teacher_logp_all.detach().to(dt), zero)
    return torch.where(m, (s.exp() * (s - t)).sum(-1), zero)


def sampled_reverse_kl_tokens(student_logp: torch.Tensor, teacher_logp: torch.Tensor,
                              mask: torch.Tensor) -> torch.Tensor:
    """(B, T) per-token KL between {sampled token, the rest} under the student and the teacher (the `sampled`
    estimator) from the (B, T) log-probs of the sampled tokens; 0 on padding, replaced (both sides by one
    value) before any arithmetic. A probability within 1e-7 of 1 has its rest's log floored there, as TRL's
    tail bucket does. The student's side keeps its gradient; the teacher's is detached."""
    if student_logp.shape != teacher_logp.shape or student_logp.shape != mask.shape:
        raise ValueError(f"need student and teacher log-probs (B, T) of one shape and a (B, T) mask, got "
                         f"{tuple(student_logp.shape)}, {tuple(teacher_logp.shape)}, {tuple(mask.shape)}")
    m = mask.bool()
    dt = torch.float64 if student_logp.dtype == torch.float64 else torch.float32
    fill = torch.full((), -1.0, dtype=dt, device=student_logp.device)
    s = torch.where(m, student_logp.to(dt), fill)
    t = torch.where(m, teacher_logp.detach().to(dt), fill)
    rest_s, rest_t = (torch.log(-torch.expm1(x.clamp(max=-1e-7))) for x in (s, t))
    kl = torch.nan_to_num(s.exp() * (s - t), nan=0.0) + torch.nan_to_num(rest_s.exp() * (rest_s - rest_t), nan=0.0)
    return torch.where(m, kl, torch.zeros((), dtype=dt, device=kl.device))


def score_kl_tokens(student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) the `score` estimator: k1_t = log p_s(x_t) - log p_t(x_t) as the value, with the gradient
    k1_t * grad log p_s(x_t) (k1 x exp(log p_s - stop_grad(log p_s)): the reverse KL as a per-token negative
    reward in an on-policy policy-gradient term). Since the student sampled x_t, its expected gradient is exactly
    the gradient of the full per-token KL; the value is the full KL's unbiased estimate. 0 on padding, replaced
    before any arithmetic; the teacher's side detached."""
    if student_logp.shape != teacher_logp.shape or student_logp.shape != mask.shape:
        raise ValueError(f"need student and teacher log-probs (B, T) of one shape and a (B, T) mask, got "
                         f"{tuple(student_logp.shape)}, {tuple(teacher_logp.shape)}, {tuple(mask.shape)}")
    m = mask.bool()
    dt = torch.float64 if student_logp.dtype == torch.float64 else torch.float32
    zero = torch.zeros((), dtype=dt, device=student_logp.device)
    s = torch.where(m, student_logp.to(dt), zero)
    k1 = torch.where(m, s.detach() - teacher_logp.detach().to(dt), zero)
    return torch.where(m, k1 * torch.exp(s - s.detach()), zero)


def distillation_loss(student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor, *,
                      estimator: str = "full", agg_mode: str = "token-mean", norm_len: int | None = None,
                      num_tokens: float | None = None, num_seqs: float | None = None
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The reverse KL aggregated like the policy loss (`agg_mode`, the step-wide normalisers: see losses.py),
    so micro-batch losses add up to the whole step's. token-mean is TRL's reduction. `estimator` full: (B, T, V)
    log-softmaxes; sampled, score: (B, T) log-probs of the sampled tokens. Returns (loss, metrics: distill/kl_mean
    and distill/kl_max over the response tokens, nan when none; sampled and score also distill/kl_k1_mean, the mean
    of log p_s - log p_t over the sampled tokens: an unbiased estimate of the full per-token reverse KL, since the
    student sampled them, which G-teacher-kl then reads)."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown distillation estimator {estimator!r}; known: {', '.join(ESTIMATORS)}")
    kl_of = {"full": reverse_kl_tokens, "sampled": sampled_reverse_kl_tokens, "score": score_kl_tokens}[estimator]
    kl = kl_of(student_logp, teacher_logp, mask)
    m = mask.bool()
    loss = get_loss_agg(agg_mode)(kl, m, norm_len=norm_len, num_tokens=num_tokens, num_seqs=num_seqs)
    with torch.no_grad():
        n = m.sum()
        nan = torch.full((), torch.nan, dtype=kl.dtype, device=kl.device)
        mean = torch.where(n > 0, kl.sum() / n.clamp(min=1), nan)
        top = torch.where(n > 0, torch.where(m, kl, torch.full_like(kl, -torch.inf)).max(), nan)
        metrics = {"distill/kl_mean": mean.float(), "distill/kl_max": top.float()}
        if estimator in SAMPLED_ONLY:
            gap = torch.where(m, student_logp.detach().to(kl.dtype) - teacher_logp.to(kl.dtype), 0.0)
            metrics["distill/kl_k1_mean"] = torch.where(n > 0, gap.sum() / n.clamp(min=1), nan).float()
    return loss, metrics


# ------------------------------------------------------------------------------------------------ the teacher
def resolve_teacher(spec: str, revision: str | None = None, *, cache_dir: str | Path,
                    store: Any = None) -> Path:
    """The local folder of the teacher named by `grpo.distill_teacher`. `run:<ref>`: the export of that rlvr run
    (`ref` as `rlvr report` takes it: run id, its first 8 characters or the run's folder) in `store` (default:
    the configured artifact store), checked against its manifest and copied under `cache_dir`; a hub id: the
    Hugging Face cache's snapshot at `revision` (never downloaded here); otherwise a local folder. Raises
    ConfigError naming the field when the teacher cannot be found."""
    try:
        if spec.startswith(RUN_PREFIX):
            return _run_export(spec[len(RUN_PREFIX):], Path(cache_dir), store)
        if hub.is_hub_id(spec):
            repo, rev = hub.split_ref(spec)
            return hub.snapshot(repo, revision=rev or revision, hash_files=False, local_only=True).folder
    except (FileNotFoundError, hub.HubMissing, OSError) as e:
        raise ConfigError(FIELD, [(FIELD, f"teacher {spec!r} not found: {e}")]) from None
    folder = Path(spec).expanduser()
    if not (folder / "config.json").is_file():
        raise ConfigError(FIELD, [(FIELD, f"teacher {spec!r} is not a model folder (no {folder / 'config.json'}); "
                                          "give a local folder, run:<run id> or a hub id")])
    return folder


def _run_export(ref: str, cache_dir: Path, store: Any) -> Path:
    """An earlier run's verified export (`<run folder>/checkpoints/final`), copied into `cache_dir/<run folder>`
    (reused when already there and it still matches the store's manifest)."""
    store = store if store is not None else open_store()
    folder = resolve_run(store, ref)
    prefix = join(folder, "checkpoints", "final")
    if not store.exists(join(prefix, "config.json")):
        raise FileNotFoundError(f"run {ref!r} ({folder} in {store.uri}) has no exported checkpoint at {prefix}")
    verify_export(store, prefix)
    local = cache_dir / folder.replace("/", "__")
    try:
        verify_local_export(local)
    except Exception:  # noqa: BLE001 - absent or partial: copy it again
        store.get_dir(prefix, local)
        verify_local_export(local)
    return local


def check_same_tokenizer(student_dir: str | Path, teacher_dir: str | Path) -> None:
    """Refuse a teacher whose tokenizer is not the student's (vocabulary, added and special tokens), before any
    model loads: ConfigError naming both tokenizer folders and `grpo.distill_teacher`."""
    from transformers import AutoTokenizer

    s = AutoTokenizer.from_pretrained(student_dir, local_files_only=True)
    t = AutoTokenizer.from_pretrained(teacher_dir, local_files_only=True)
    sv, tv = s.get_vocab(), t.get_vocab()
    why = None
    if sv != tv:
        diff = sorted(set(sv.items()) ^ set(tv.items()))[:3]
        why = f"the vocabularies differ ({len(sv)} vs {len(tv)} tokens; e.g. {diff})"
    else:
        special = [(k, getattr(s, k), getattr(t, k)) for k in ("bos_token_id", "eos_token_id", "pad_token_id",
                                                               "unk_token_id") if getattr(s, k) != getattr(t, k)]
        if special:
            why = "the special tokens differ (" + ", ".join(f"{k} {a} vs {b}" for k, a, b in special) + ")"
    if why:
        raise ConfigError(f"{Path(teacher_dir)} vs {Path(student_dir)}", [(FIELD, (
            f"the teacher's tokenizer is not the student's: {why}. The teacher scores the student's token ids, "
            "so both must read them as the same text; pick a teacher of the student's family and tokenizer"))])


def checked_teacher(grpo: Any, student_dir: str | Path, cache_dir: str | Path) -> Path:
    """Everything that refuses a teacher, before any model loads: its folder found (`resolve_teacher`, a run's
    export copied under `cache_dir`), its tokenizer the student's (`check_same_tokenizer`), and each of its
    servers (`grpo.distill_teacher_servers`) answering /health (else ConfigError naming that field). `grpo`: the
    GRPO config. Returns the teacher's folder."""
    folder = resolve_teacher(grpo.distill_teacher, grpo.distill_teacher_revision, cache_dir=cache_dir)
    check_same_tokenizer(student_dir, folder)
    down = [u for u in grpo.distill_teacher_servers or () if not ServerClient(u).healthy(timeout=10.0)]
    if down:
        raise ConfigError(SERVERS_FIELD, [(SERVERS_FIELD, f"the teacher server {u} does not answer /health: start "
                                                          "`vllm serve <teacher folder> --enable-scale-out` there or "
                                                          "fix the URL") for u in down])
    return folder


def load_teacher(teacher_dir: str | Path, student_vocab: int) -> torch.nn.Module:
    """The teacher, in float32 on CPU, eval mode, no gradient. Its output head must have the student's width
    (`student_vocab` logits): the KL compares the two distributions entry by entry."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(teacher_dir, local_files_only=True, torch_dtype=torch.float32)
    width = model.get_output_embeddings().weight.shape[0]
    if width != student_vocab:
        raise ConfigError(str(teacher_dir), [(FIELD, f"the teacher has {width} output logits, the student "
                                                     f"{student_vocab}: the reverse KL needs one vocabulary")])
    return model.eval().requires_grad_(False)


class LocalTeacher:
    """The teacher model in the training process (`load_teacher`): any estimator."""

    def __init__(self, model: torch.nn.Module, estimator: str = "full"):
        self.model, self.estimator = model, estimator
        self.where = "in process, on CPU"

    def logprobs(self, batch: dict, mask: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The teacher's log-probs at the student's response positions (`update.build_batch`'s batch), computed
        on the teacher's device without gradient and moved to `device`: (B, T, V) log-softmax for the full
        estimator, (B, T) log-probs of the sampled tokens for the others."""
        here = next(self.model.parameters()).device
        on_teacher = {k: v.to(here) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        with torch.no_grad():
            logp, _, logp_all = full_vocab_logprobs(self.model, on_teacher)
        return (logp_all if self.estimator == "full" else logp).to(device)

    def close(self) -> None:
        pass


class ServerTeacher:
    """The teacher served by `vllm serve` processes at `urls` (`grpo.distill_teacher_servers`): each sequence's
    prompt log-probs over prompt + completion give the teacher's log-prob of every sampled token (the sampled
    and score estimators; a server does not return whole distributions). Sequences go round-robin over the
    servers, all requests in flight at once (vLLM batches them); a dead or slow server is a ServerError naming it."""

    def __init__(self, urls: list[str], estimator: str = "sampled", *, request_timeout_s: float = 300.0,
                 max_concurrency: int = 64):
        if estimator not in SAMPLED_ONLY:
            raise ValueError(f"a teacher server gives the sampled tokens' log-probs only: estimator {estimator!r} "
                             f"needs whole distributions (use one of {', '.join(SAMPLED_ONLY)})")
        self.estimator = estimator
        self.clients = [ServerClient(u, request_timeout_s) for u in urls]
        self._pool = ThreadPoolExecutor(max_workers=max(max_concurrency, len(urls)), thread_name_prefix="rlvr-teacher")
        self.where = "on vLLM server" + ("s " if len(urls) > 1 else " ") + ", ".join(urls)

    def logprobs(self, batch: dict, mask: torch.Tensor, device: torch.device) -> torch.Tensor:
        """(B, T) teacher log-probs of the sampled tokens of `update.build_batch`'s batch; 0 on padding and on
        sequences with no trained token (not sent)."""
        ids, lengths = batch["input_ids"].cpu(), batch["lengths"].cpu()
        total = batch["attention_mask"].cpu().sum(-1)
        out = torch.zeros(mask.shape, dtype=torch.float32)
        rows = [b for b in range(len(ids)) if bool(mask[b].any())]
        jobs = [self._pool.submit(self.clients[k % len(self.clients)].prompt_logprobs, ids[b, :int(total[b])].tolist())
                for k, b in enumerate(rows)]
        for b, job in zip(rows, jobs):
            start, n = int(total[b]) - int(lengths[b]) - 1, int(lengths[b])  # lp[j - 1] scores token j
            out[b, :n] = torch.tensor(job.result()[start:start + n], dtype=torch.float32)
        return out.to(device)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
