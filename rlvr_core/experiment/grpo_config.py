"""The GRPO section of the experiment config (`grpo:`; docs/grpo_training.md): `GRPOConfig`, its nested
sections (`memory`, `launch`, `guards`), which settings name the training folder (`InKey` for what changes the
trained weights, `NamesRun` for what only names the run, a section's `IN_KEY`; `grpo_key_dump`), and the
deprecation of the pre-section flat keys (`moved_override`)."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from rlvr_core.core import hub
from rlvr_core.core.registry import ADVANTAGES, KL_ESTIMATORS, LOSS_AGGS, POLICY_LOSSES, Registry
from rlvr_core.experiment.config_base import AddedLater, InKey, NamesRun, key_fields, one_of
from rlvr_core.experiment.guards import HealthConfig
from rlvr_core.experiment.hostfile import read_hostfile


class _Section(AddedLater):
    """A group of GRPO settings under its own key (`grpo.memory`, `grpo.launch`). `IN_KEY` declares whether the
    training folder's key holds the section: False for settings that only reorder sums or say where ranks run,
    so a run resumes from its checkpoint when they change (the G-oom line: lower the memory settings and retry).
    `FLAT` maps a field to its name before the sections existed, where that differs from its own."""

    IN_KEY: ClassVar[bool]
    FLAT: ClassVar[dict[str, str]] = {}

    def flat(self) -> dict[str, Any]:
        """The section's fields by their pre-section names (the shape keys and recorded numerics keep)."""
        return {self.FLAT.get(k, k): v for k, v in self.model_dump(mode="json").items()}


class GRPOMemoryConfig(_Section):
    """How one update fits in memory (docs/grpo_training.md, "Memory of the update"); none of it changes the
    maths, so it stays out of the training folder's key."""

    IN_KEY: ClassVar[bool] = False

    micro_batch_size: int | None = Field(None, ge=1, description="sequences per forward/backward on each rank; the "
                                         "rank's share of the batch is split into micro-batches whose gradients "
                                         "are accumulated into one optimizer step per epoch (loss and gradient "
                                         "equal the unsplit ones). None = the whole rank batch in one pass")
    max_tokens_per_micro_batch: int | None = Field(None, ge=1, description="token budget of one micro-batch: "
                                                   "sequences (prompt + completion) are sorted by length and "
                                                   "packed greedily while rows x longest length stays within the "
                                                   "budget (a longer sequence gets a micro-batch of its own); "
                                                   "combines with micro_batch_size (both limits hold). None = no budget")
    logprob_chunk_size: int = Field(1024, ge=0, description="response positions whose vocabulary-wide logits are "
                                    "formed at once when computing log-probs and entropy (float32, recomputed in "
                                    "the backward), so the logits cost chunk x vocab, not batch x length x vocab; "
                                    "only response positions are projected. 0 = the full log_softmax over every "
                                    "position (the reference path, memory O(batch x length x vocab))")
    pack_sequences: bool = Field(False, description="with logprob_chunk_size > 0: a micro-batch's sequences are "
                                 "packed first-fit into as few rows of the longest one's width as hold them "
                                 "(position ids restart per sequence, so the attention keeps each to itself), so "
                                 "fewer padded positions are computed; the same log-probs and gradients within "
                                 "float rounding (docs/grpo_training.md)")
    gradient_checkpointing: bool = Field(False, description="recompute each decoder layer's activations in the "
                                         "backward (Hugging Face gradient checkpointing, non-reentrant) instead "
                                         "of storing them: ~1/3 more compute for activation memory of one layer; "
                                         "same loss and gradient. Needs a model without dropout (the trainer "
                                         "runs with dropout off)")


class GRPOLaunchConfig(_Section):
    """How the stage starts its ranks (docs/gpu.md, "Multi-node"): N ranks train like one process, so it stays
    out of the key and a run started on one node resumes on two (the change is recorded like the thread count)."""

    IN_KEY: ClassVar[bool] = False
    FLAT: ClassVar[dict[str, str]] = {"mode": "launch"}

    mode: Literal["local", "torchrun", "deepspeed"] = Field(
        "local", description="local: the stage trains in its own process (or under whatever launcher started it). "
        "torchrun / deepspeed: the stage starts nnodes x nproc_per_node ranks, one torch.distributed.run / "
        "deepspeed.launcher.launch per node (deepspeed: the nodes are hostfile's hosts), waits for them, and stops "
        "the whole group when one node fails (a retry relaunches every node and resumes from the last checkpoint)")
    nnodes: int = Field(1, ge=1, description="torchrun, deepspeed: nodes in the group (node 0 runs where the stage "
                        "runs)")
    nproc_per_node: int = Field(1, ge=1, description="torchrun, deepspeed: ranks per node (one per GPU)")
    rdzv_endpoint: str = Field("127.0.0.1:0", description="torchrun, deepspeed: HOST:PORT of node 0's rendezvous "
                               "store (--master_addr/--master_port), reachable from every node; port 0 picks a free "
                               "port at launch (only for a group whose nodes all run on this host)")
    node_command: str = Field("", description="torchrun, deepspeed: the prefix that starts node i >= 1 on its "
                              "host, with {host} replaced by hosts[i-1] (deepspeed: the hostfile's i-th host), e.g. "
                              "'ssh {host}'; empty: every node runs on this host. The training folder must be on a "
                              "disk every node sees (DeepSpeed checkpoints are written by every rank)")
    hosts: list[str] = Field(default_factory=list, description="torchrun: the host of nodes 1..nnodes-1 for "
                             "node_command's {host} (nnodes - 1 entries when node_command names {host})")
    hostfile: str = Field("", description="deepspeed: a DeepSpeed hostfile, one 'HOST slots=N' line per node "
                          "(node 0, where the stage runs, first); its hosts fill node_command's {host}; it must "
                          "list nnodes hosts of nproc_per_node slots each (after include/exclude)")
    include: str = Field("", description="deepspeed: DeepSpeed's --include filter of the hostfile, e.g. "
                         "'worker-0@worker-1:0,2'")
    exclude: str = Field("", description="deepspeed: DeepSpeed's --exclude filter of the hostfile")


    @model_validator(mode="after")
    def _nodes_fit(self) -> "GRPOLaunchConfig":
        if self.mode != "deepspeed" and "{host}" in self.node_command and len(self.hosts) != self.nnodes - 1:
            raise ValueError(f"node_command names {{host}}, so hosts needs nnodes - 1 = {self.nnodes - 1} entries "
                             f"(the hosts of nodes 1..{self.nnodes - 1}), got {len(self.hosts)}")
        self._hostfile_fits()
        host, _, port = self.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"rdzv_endpoint must be HOST:PORT, got {self.rdzv_endpoint!r}")
        return self

    def _hostfile_fits(self) -> None:
        """deepspeed: the hostfile names the nodes (read here, before any work); torchrun: hosts does."""
        if self.mode != "deepspeed":
            if self.hostfile or self.include or self.exclude:
                raise ValueError(f"hostfile / include / exclude are for mode deepspeed, not {self.mode}")
            return
        if not self.hostfile:
            raise ValueError("mode deepspeed needs a hostfile (one 'HOST slots=N' line per node)")
        if self.hosts:
            raise ValueError("mode deepspeed takes the nodes' hosts from the hostfile; leave hosts empty")
        read_hostfile(self.hostfile, self.include, self.exclude, nnodes=self.nnodes,
                      nproc_per_node=self.nproc_per_node)


class GRPOGuardsConfig(_Section):
    """The training guards' thresholds and the drift signal they read (docs/guards_training.md). In the key, as
    they were before the sections: a guard that stops a run decides which weights the folder holds."""

    IN_KEY: ClassVar[bool] = True

    logprob_guard_tol: float | None = Field(None, gt=0, description="G-logprob-temp: max mean |trainer - rollout| "
                                            "log-prob at step 1; None = 1e-3 (fp32) / 5e-2 (bf16, fp16)")
    ratio_guard_tol: float = Field(0.05, gt=0, description="G-onpolicy-ratio: flag a step whose first-epoch "
                                   "|ratio_mean - 1| or clip fraction exceeds this")
    kl_spike_max: float = Field(1000.0, gt=0, description="G-kl-explosion: flag a step whose max token KL to the "
                                "reference exceeds this (1000, the episode detector's max_limit: healthy runs stay "
                                "under it, docs/guards_training.md; 10 flagged 89 of the healthy demo's 120 steps)")
    zero_var_guard_share: float = Field(0.9, gt=0, le=1, description="G-verifier-format: flag a step when the "
                                        "mean share of zero-reward-variance groups over the last "
                                        "zero_var_guard_window steps is at least this (0.9: 9 groups in 10 carry no "
                                        "learning signal; with G = 8 a healthy model would need a mean pass rate "
                                        "under ~1.3 % or over ~98.7 % to get there)")
    zero_var_guard_window: int = Field(5, ge=1, description="G-verifier-format: steps averaged (this one and the "
                                       "ones before it; fewer at the start of a run), so one unlucky step does not "
                                       "fire and a run with no signal fires within this many steps")
    drift_every: int = Field(4, ge=0, description="beta 0 only (no reference model): every N steps, after the "
                             "update, one no-grad forward over the step's trained completions gives the per-token "
                             "KL from the policy that sampled them to the updated one (k3), recorded as "
                             "drift/kl_mean and drift/kl_max, which G-kl-explosion and G-entropy's stop watch "
                             "when kl_ref_* are missing (docs/guards_training.md). Costs one forward pass "
                             "(no backward) on the measured steps, hence every 4th by default. 0 = off (those "
                             "guards are blind at beta 0). Skipped with beta > 0, where the KL to the reference "
                             "is measured every step")
    correction_mask_share: float = Field(0.5, gt=0, le=1, description="G-correction-mask: flag a step whose "
                                         "rollout correction (grpo.tis_mode token_mask or sequence_mask) rejects "
                                         "more than this share of the response tokens: the update then learns "
                                         "from a minority of what was sampled, and rollout engine and trainer "
                                         "disagree more than the bounds allow (tis_cap, tis_min too tight, or "
                                         "a broken engine). Left out of the training key at its default")
    teacher_kl_max: float = Field(10.0, gt=0, description="G-teacher-kl: with grpo.distill_teacher, flag a step "
                                  "whose mean per-token reverse KL(student || teacher) exceeds this many nats "
                                  "(distill/kl_mean; distill/kl_k1_mean, its estimate from the sampled tokens, "
                                  "with distill_estimator sampled or score): "
                                  "the teacher and the student no longer agree on what the samples mean (a "
                                  "teacher of another tokenizer or family, a broken teacher checkpoint, a "
                                  "student pushed off by the reward term). Left out of the training key at its "
                                  "default")
    health: HealthConfig = Field(default_factory=HealthConfig, description="the run-level training guards "
                                 "(docs/guards_training.md): per detector (collapse, entropy, reward_hacking, "
                                 "kl_explosion, no_signal) its thresholds, and `enabled`, the guard ids to run; e.g. "
                                 "{collapse: {grad_norm_factor: 8}, kl_explosion: {serious: true}} makes collapse "
                                 "need a larger grad-norm jump and a KL blow-up stop the run. Unset = defaults; the "
                                 "resolved config and the key hold the settings given, as written")

    _ADDED_LATER: ClassVar[tuple[str, ...]] = ("correction_mask_share", "teacher_kl_max")


class GRPOConfig(AddedLater):
    """Policy optimisation settings for `rlvr_core.grpo.trainer.train_grpo` (docs/grpo_training.md).

    Defaults: conservative (lr 5e-5, rollouts at T 1, no KL anchor; ~150 steps x ~1.1 s on the demo's
    tiny model on 2 CPU cores), which moves held-out greedy accuracy little (-5 to +0.5 points). The
    demo itself trains with DEMO_SETTINGS (config.py): 120 steps, rollouts at T 1.0, lr 3e-4 after 10 warm-up
    steps, beta 0.1 and dynamic sampling (docs/grpo_tuning.md has what was tried and the seed variation).
    A higher lr (5e-4 constant, 1e-3) collapsed or unlearned the arithmetic; no KL anchor (beta 0) lost
    accuracy.
    """

    enabled: bool = NamesRun(False, description="run the GRPO training stage")
    steps: int = InKey(150, ge=1, description="optimisation steps (each = one rollout batch of P x G completions)")
    prompts_per_step: int = InKey(16, ge=1, description="P: prompts per step, taken in curriculum order (cycled)")
    group_size: int = InKey(8, ge=2, description="G: completions per prompt (the group)")
    temperature: float = InKey(1.0, gt=0, description="rollout sampling temperature (trainer log-probs stay raw, T=1)")
    top_p: float = InKey(1.0, gt=0, le=1, description="rollout nucleus mass (1 = off)")
    lr: float = InKey(5e-5, gt=0, description="peak AdamW learning rate")
    adam_eps: float = InKey(1e-8, gt=0, description="AdamW eps; the seeds' 1e-7 with no warm-up exploded (G-kl-explosion)")
    weight_decay: float = InKey(0.0, ge=0, description="AdamW weight decay")
    warmup_steps: int = InKey(5, ge=0, description="linear warm-up steps (then cosine decay to cos_min_ratio x lr)")
    cos_min_ratio: float = InKey(0.1, ge=0, le=1, description="lr floor of the cosine decay, as a fraction of lr")
    beta: float = InKey(0.0, ge=0, description="KL coefficient (0 = no reference model)")
    kl_estimator: str = InKey("k3", description="per-token KL-to-reference estimator when beta > 0 (Schulman's "
                              "k1/k2/k3; k3 is unbiased and never negative; docs/grpo_algorithms.md); any name "
                              "registered as a kl_estimator (rlvr_core/core/registry.py)")
    clip_low: float = InKey(0.2, gt=0, description="PPO ratio clip below 1 (1 - clip_low); raise it only with a reason: "
                            "it bounds how far one update can push a sampled token down")
    clip_high: float = InKey(0.28, gt=0, description="clip-higher (DAPO)")
    advantage: str = InKey("grpo", description="group advantage estimator: grpo (mean/std), dr_grpo (mean only, "
                           "no std bias), rloo (leave-one-out mean); docs/grpo_algorithms.md; any name registered "
                           "as an advantage (rlvr_core/core/registry.py)")
    negative_advantage_weight: float = InKey(1.0, ge=0, le=1, description="multiplies negative advantages "
                                             "(1 = the estimator as it is; 0 = positive samples only, PSR; "
                                             "Zhu et al. 2025, arXiv 2506.01347)")
    loss_agg: str = InKey("token-mean", description="loss aggregation: token-mean, seq-mean-token-mean or "
                          "seq-mean-token-sum-norm (docs/grpo_algorithms.md; sum-norm uses max_new_tokens); any "
                          "name registered as a loss_agg (rlvr_core/core/registry.py)")
    policy_loss: str = InKey("ppo_clip", description="policy-gradient loss: ppo_clip (PPO clipped surrogate with "
                             "clip_low / clip_high, DAPO clip-higher), gspo (the clipped surrogate on the "
                             "sequence ratio exp(mean log-ratio); gspo_clip_low / gspo_clip_high), luspo (gspo "
                             "with each sequence's loss times its length; needs loss_agg seq-mean-token-sum), "
                             "cispo (REINFORCE with the stop-gradient weight min(ratio, cispo_clip_max)), sapo "
                             "(a soft sigmoid gate instead of the clip; sapo_tau_pos / sapo_tau_neg); "
                             "docs/grpo_algorithms.md; any name registered as a policy_loss "
                             "(rlvr_core/core/registry.py). Left out of the resolved config, its hash and the "
                             "training key while it is ppo_clip, so runs from before the field keep their keys")
    gspo_clip_low: float = InKey(3e-4, gt=0, lt=1, description="gspo, luspo: the sequence ratio's clip below 1 "
                                 "(1 - gspo_clip_low). A sequence ratio is a geometric mean of token ratios and "
                                 "moves far less than one token's, hence GSPO's 3e-4 (arXiv 2507.18071)")
    gspo_clip_high: float = InKey(4e-4, gt=0, description="gspo, luspo: the sequence ratio's clip above 1 "
                                  "(1 + gspo_clip_high); GSPO's 4e-4")
    cispo_clip_max: float = InKey(5.0, gt=0, description="cispo: upper bound of the importance weight min(ratio, "
                                  "cispo_clip_max), used as a constant (stop-gradient) factor; an absolute bound "
                                  "on the ratio, TRL's epsilon_high for cispo (ScaleRL's recommended 5.0)")
    sapo_tau_pos: float = InKey(1.0, gt=0, description="sapo: gate temperature of tokens with a positive "
                                "advantage: the term is (4 / tau) sigmoid(tau (ratio - 1)) A; a higher tau "
                                "fades the gradient faster as the ratio leaves 1 (arXiv 2511.20347: 1.0)")
    sapo_tau_neg: float = InKey(1.05, gt=0, description="sapo: gate temperature of tokens with a non-positive "
                                "advantage (the paper's 1.05: negative updates fade a little faster)")
    distill_teacher: str | None = InKey(None, min_length=1, description="on-policy distillation "
                                        "(docs/grpo_algorithms.md): a teacher scores the student's own rollouts "
                                        "and the per-token reverse KL(student || teacher) is "
                                        "a training signal (rlvr_core/grpo/distillation.py). A local model folder, "
                                        "run:<run id> (the exported checkpoint of an earlier rlvr run in the "
                                        "artifact store) or a hub id read from the Hugging Face cache (`rlvr pull "
                                        "model` it first). Its tokenizer must be the student's (refused before "
                                        "the model loads). It runs on CPU in the training process, or on vLLM "
                                        "servers (distill_teacher_servers). With distill_estimator full the "
                                        "student's log-probs take the full-vocabulary path (memory."
                                        "logprob_chunk_size and pack_sequences are not used). None = off")
    distill_teacher_revision: str | None = InKey(None, min_length=1, description="distill_teacher a hub id: the "
                                                 "commit (recommended), branch or tag of its cached snapshot")
    distill_weight: float = InKey(1.0, ge=0, le=1, description="with distill_teacher: the loss is (1 - w) x the "
                                  "GRPO loss on the verifiable reward + w x the reverse KL to the teacher "
                                  "(aggregated like the policy loss, loss_agg). 1 = distillation alone, 0.5 = an "
                                  "equal mix; 0 = the teacher is only measured (distill/kl_* columns, G-teacher-kl)")
    distill_estimator: Literal["full", "sampled", "score"] = InKey(
        "full", description="with distill_teacher: how the per-token reverse KL is computed (distillation.py). full: "
        "exact over the vocabulary, needs the teacher's whole distribution (an in-process teacher; TRL's "
        "DistillationTrainer); sampled: the KL between {the sampled token, the rest} under student and teacher, "
        "needs only the teacher's log-prob of each sampled token (what a vLLM server returns; TRL's "
        "ServerDistillationTrainer), a lower bound of the full KL that keeps the chunked log-prob path; score: "
        "log p_student - log p_teacher of each sampled token as a per-token negative reward in an on-policy "
        "policy-gradient term (Thinking Machines' on-policy distillation), whose expected gradient is the full "
        "KL's, from the same log-probs as sampled. Default: full, sampled with distill_teacher_servers")
    distill_teacher_servers: list[str] | None = InKey(
        None, min_length=1, description="with distill_teacher: URLs of `vllm serve` processes serving that teacher, "
        "which score the student's rollouts (prompt log-probs) instead of a copy in the training process; "
        "distill_teacher is then read for its tokenizer only. Needs distill_estimator sampled (the default with "
        "servers) or score. In the training folder's key: a served teacher computes in the server's dtype and kernels. "
        "None = the teacher runs in process")
    epochs_per_step: int = InKey(1, ge=1, description="optimisation epochs over each rollout batch (1 = on-policy)")
    memory: GRPOMemoryConfig = Field(default_factory=GRPOMemoryConfig, description="how the update fits in memory "
                                     "(docs/grpo_training.md, \"Memory of the update\"); out of the training folder's key")
    zero_stage: Literal[0, 1, 2, 3] = InKey(2, description="DeepSpeed ZeRO stage: 2 shards optimizer state and "
                                            "gradients; 3 also shards the weights (for models that do not fit one device)")
    zero3_sampling_replica: bool = InKey(False, description="ZeRO-3 only: keep a full plain copy of the policy on "
                                         "every rank for sampling, evaluation and export, refreshed from the "
                                         "partitions before each use (the old behaviour: one whole model more per "
                                         "rank). False: the HF engine samples the partitioned policy itself, all "
                                         "ranks in lockstep (DeepSpeed gathers one layer's weights at a time), and "
                                         "evaluation/export gather a transient full copy on rank 0 only when they run")
    precision: Literal["fp32", "bf16", "fp16"] = InKey("fp32", description="training precision; bf16 on GPUs that "
                                                       "have it (the G-logprob-temp tolerance widens to 5e-2)")
    grad_clip: float = InKey(1.0, gt=0, description="global gradient-norm clip; grad_norm in steps.parquet is "
                             "measured before it (G-collapse watches it)")
    rollout_batch_size: int = InKey(128, ge=1, description="sequences decoded together by the rollout engine")
    eval_every: int | Literal["auto"] = NamesRun(
        "auto", description="call the trainer's `evaluate` hook every N steps and after the last (G-no-eval). "
        "'auto' = about 10 evaluation points for a run longer than 40 steps (every ceil(steps / 10) steps), "
        "only after the last step for a shorter one. 0 = only after the last step: no curve to pick a "
        "checkpoint from, and G-reward-hacking can never fire (it needs eval points during training)")
    eval_max_problems: int | None = NamesRun(
        500, ge=1, description="the periodic evaluation scores greedily the first N held-out problems only (a "
        "fixed slice, the same at every point, so the points compare); the pipeline's evaluation of the final "
        "export stays on the whole held-out set. None = the whole set (the demo's 200 problems fit in 500)")
    eval_samples: int = NamesRun(0, ge=0, description="periodic evaluation: sampled completions per held-out problem "
                                 "for pass@k at eval.temperature (0 = greedy accuracy only)")
    checkpoint_every: int = NamesRun(25, ge=1, description="DeepSpeed checkpoint every N steps (and always at the end)")
    guards: GRPOGuardsConfig = Field(default_factory=GRPOGuardsConfig, description="the training guards' thresholds "
                                     "and the drift signal (docs/guards_training.md); in the training folder's key")
    logprob_temperature: float = InKey(1.0, gt=0, description="temperature the trainer divides logits by before "
                                       "log_softmax. Must stay 1 (rollout log-probs are raw); exists to plant "
                                       "the G-logprob-temp bug in tests")
    # ---- optional algorithms (all off by default; docs/grpo_training.md, "Options") ----
    dynamic_sampling: bool = InKey(False, description="DAPO dynamic sampling (arXiv 2503.14476, sec. 3.2): drop groups "
                                   "whose (shaped) rewards are all equal and sample the next P curriculum prompts "
                                   "until P informative groups or dynamic_sampling_max_rounds rounds; a short batch "
                                   "is trained as it is (G-partial-batch). The data position advances by every "
                                   "prompt sampled")
    dynamic_sampling_max_rounds: int = InKey(4, ge=1, description="dynamic sampling: at most this many rollout rounds "
                                             "(of P prompts each) per step, the first included")
    adaptive_sampling: bool = InKey(False, description="adaptive sampling (seed 001's GSM8K runs: k_success 2, "
                                    "k_failure 2, at most 64, chunks of 8): each prompt is sampled in chunks of "
                                    "group_size completions until it has adaptive_k_success correct and "
                                    "adaptive_k_failure incorrect ones, or adaptive_max_samples; groups then differ "
                                    "in size and advantages are computed per group over the completions it has")
    adaptive_k_success: int = InKey(2, ge=0, description="adaptive sampling: correct completions a prompt needs")
    adaptive_k_failure: int = InKey(2, ge=0, description="adaptive sampling: incorrect completions a prompt needs")
    adaptive_max_samples: int = InKey(64, ge=2, description="adaptive sampling: the most completions of one prompt "
                                      "in a step (the last chunk is cut to fit)")
    max_staleness: int = InKey(0, ge=0, description="bounded staleness: step t's rollouts come from the policy after "
                               "max(0, t - max_staleness) updates, sampled ahead by a background thread on its own "
                               "copy of the weights (synced from the policy every step) through a bounded buffer, "
                               "so generation overlaps training. 0 = on-policy (the rollouts of step t use the "
                               "weights it updates). Not with dynamic or adaptive sampling, which decide from "
                               "verified rewards during the rollout")
    overlong_buffer_len: int = InKey(0, ge=0, description="DAPO soft overlong punishment (sec. 3.4): width in tokens "
                                     "of the window before max_new_tokens where the reward is lowered linearly, from 0 "
                                     "at max_new_tokens - len to -overlong_penalty_factor at max_new_tokens "
                                     "(0 = off; must be <= max_new_tokens)")
    overlong_penalty_factor: float = InKey(1.0, ge=0, description="the largest overlong penalty (a completion of "
                                           "max_new_tokens tokens); added to the verifier reward before advantages")
    dlogp_reweight_c: float = InKey(0.0, ge=0, description="Δlog p training-time reweighting (seed 004): each "
                                    "token's advantage is multiplied by 1 + c - c * pi_old(token); 0 = off (the "
                                    "loss is bit-identical to no reweighting)")
    tis_cap: float | None = InKey(None, gt=0, description="truncated importance sampling (TIS, as verl; TRL's "
                                  "vllm_importance_sampling_correction in token_truncate mode): the PPO ratio's old "
                                  "log-probs become the trainer's own log-probs of the sampled tokens before the "
                                  "step's first update, and each token's policy-loss term is multiplied by "
                                  "min(exp(trainer_logp - rollout_logp), tis_cap) (no gradient). Use it when the "
                                  "rollout engine and the trainer disagree on log-probs (bf16 on GPU, different "
                                  "kernels, vLLM; see the logprob_mismatch/* columns); e.g. 2 (verl) or 3 (TRL). "
                                  "None = off (the loss is bit-identical to no correction). The upper bound "
                                  "C_max of every tis_mode")
    tis_mode: Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = InKey(
        "token_truncate", description="rollout correction with tis_cap set (rlvr_core/grpo/rollout_correction.py; "
        "TRL's vllm_importance_sampling_mode): token_truncate: each token's weight is its ratio clipped to "
        "[tis_min, tis_cap]; token_mask: tokens whose ratio leaves [tis_min, tis_cap] are rejected (they leave "
        "the loss and its denominators), the others weigh their ratio; sequence_truncate / sequence_mask: the "
        "same with one ratio per sequence (tis_seq_ratio) on all its tokens. The tis/* and mismatch/* columns say "
        "how much each rejects or clips; G-correction-mask flags a step that rejects most tokens")
    tis_min: float | None = InKey(None, ge=0, description="rollout correction: lower bound C_min of the ratio "
                                  "(truncate modes clip up to it, mask modes reject below it); None = no lower "
                                  "bound. Must be below tis_cap; e.g. 0.5 with tis_cap 2 for sequence_mask")
    tis_seq_ratio: Literal["geometric", "product"] = InKey(
        "geometric", description="sequence_* modes: the sequence's ratio from its token log-ratios, in log space: "
        "geometric = exp(mean) (length-normalised, verl's geometric rejection sampling: the bounds mean the same "
        "for short and long answers), product = exp(sum) (TRL's and verl's sequence-level IS; saturates at "
        "exp(+-20))")
    rollout_samples_per_step: int = NamesRun(4, ge=0, description="completions per step written to "
                                             "out_dir/rollouts.parquet (text, reward, status, length; taken "
                                             "round-robin over the trained groups; 0 = none)")
    # ---- LoRA (peft): train low-rank adapters instead of every weight ----
    lora_rank: int = InKey(0, ge=0, description="LoRA adapter rank (peft) on the policy's linear layers; 0 = full "
                           "fine-tuning. With LoRA the KL reference is the base model itself (adapters switched "
                           "off), so no second copy of the model is held")
    lora_alpha: float = InKey(16.0, gt=0, description="LoRA scale numerator: an adapter's update is scaled by "
                              "lora_alpha / lora_rank")
    lora_target_modules: list[str] | None = InKey(None, description="names of the modules to adapt, e.g. "
                                                  "[q_proj, v_proj]; None = every linear layer except the "
                                                  "output head (peft's 'all-linear')")

    launch: GRPOLaunchConfig = Field(default_factory=GRPOLaunchConfig, description="how the stage starts its ranks "
                                     "(docs/gpu.md, \"Multi-node\"); out of the training folder's key")

    @classmethod
    def sections(cls) -> dict[str, type[_Section]]:
        """{field name: section class} of the fields that are sections (`grpo.memory`, `grpo.launch`)."""
        return {name: f.annotation for name, f in cls.model_fields.items()
                if isinstance(f.annotation, type) and issubclass(f.annotation, _Section)}

    @classmethod
    def moved_keys(cls) -> dict[str, tuple[str, str]]:
        """{pre-section name: (section, field)}: `micro_batch_size` -> ("memory", "micro_batch_size")."""
        return {sec.FLAT.get(f, f): (name, f) for name, sec in cls.sections().items() for f in sec.model_fields}

    @model_validator(mode="before")
    @classmethod
    def _moved_into_sections(cls, data: Any, info: ValidationInfo) -> Any:
        """Pre-section keys (`grpo.micro_batch_size: 4`, `grpo.launch: torchrun`) still work: each moves into its
        section with a one-line ConfigDeprecation naming the new place; giving both places is an error."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        # A section's own old name first (`launch: torchrun`), so its fields moved after it join the same mapping.
        for old, (name, field) in sorted(cls.moved_keys().items(), key=lambda kv: kv[0] != kv[1][0]):
            if old not in data or (old == name and isinstance(data[old], (dict, BaseModel))):
                continue
            value = data.pop(old)
            section = data.get(name)
            if isinstance(section, BaseModel):
                section = section.model_dump(exclude_unset=True)
            if not isinstance(section, dict | None):
                data[old] = value
                continue  # the section's own check names the problem
            if field in (section or {}):
                raise ValueError(f"grpo.{old} and grpo.{name}.{field} are both set: grpo.{old} is the old name, "
                                 f"keep grpo.{name}.{field}")
            say_moved(f"grpo.{old}", f"grpo.{name}.{field}", (info.context or {}).get("source", "<config>"))
            data[name] = {**(section or {}), field: value}
        return data

    # Fields that name an implementation, checked against its registry's names (rlvr_core/core/registry.py lists
    # the built-ins torch-free): a name registered at runtime is accepted, an unknown one fails listing the names.
    _REGISTRIES: ClassVar[dict[str, Registry]] = {"advantage": ADVANTAGES, "kl_estimator": KL_ESTIMATORS,
                                                  "loss_agg": LOSS_AGGS, "policy_loss": POLICY_LOSSES}

    # Fields added after runs were keyed (`AddedLater`): dumped only away from their default, the behaviour of
    # every earlier run, so the resolved config, its hash and the training folder's key of such a run stay the same.
    _ADDED_LATER: ClassVar[tuple[str, ...]] = (
        "policy_loss", "gspo_clip_low", "gspo_clip_high", "cispo_clip_max", "sapo_tau_pos", "sapo_tau_neg", "tis_mode",
        "tis_min", "tis_seq_ratio", "distill_teacher", "distill_teacher_revision", "distill_weight", "distill_estimator",
        "distill_teacher_servers")

    # The GRPOConfig fields each policy loss takes, by the loss's keyword (policy_losses.py). A loss not listed
    # (ppo_clip, or one registered at runtime) gets clip_low / clip_high, as before these losses existed.
    _LOSS_PARAMS: ClassVar[dict[str, dict[str, str]]] = {
        "gspo": {"clip_low": "gspo_clip_low", "clip_high": "gspo_clip_high"},
        "luspo": {"clip_low": "gspo_clip_low", "clip_high": "gspo_clip_high"},
        "cispo": {"clip_max": "cispo_clip_max"},
        "sapo": {"tau_pos": "sapo_tau_pos", "tau_neg": "sapo_tau_neg"},
    }

    def policy_loss_params(self) -> dict[str, Any] | None:
        """The chosen policy loss's parameters for `grpo_loss(loss_params=...)`; None = clip_low / clip_high."""
        fields = self._LOSS_PARAMS.get(self.policy_loss)
        return None if fields is None else {kw: getattr(self, f) for kw, f in fields.items()}

    @field_validator(*_REGISTRIES)
    @classmethod
    def _registered(cls, v: str, info: ValidationInfo) -> str:
        registry = cls._REGISTRIES[info.field_name]
        return one_of(v, registry.names(), registry.kind)

    @field_validator("eval_every")
    @classmethod
    def _eval_every_count(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0:
            raise ValueError(f"must be 'auto' or an integer >= 0, got {v}")
        return v

    AUTO_EVAL_MIN_STEPS: ClassVar[int] = 40  # runs up to this long evaluate only after the last step
    AUTO_EVAL_POINTS: ClassVar[int] = 10

    def eval_interval(self) -> int:
        """The periodic evaluation's interval in steps that `eval_every` resolves to (0 = after the last only)."""
        if self.eval_every != "auto":
            return int(self.eval_every)
        if self.steps <= self.AUTO_EVAL_MIN_STEPS:
            return 0
        return -(-self.steps // self.AUTO_EVAL_POINTS)

    def drift_active(self) -> bool:
        """Whether the beta-0 drift signal is measured (drift/kl_* columns)."""
        return self.beta == 0 and self.guards.drift_every > 0

    @model_validator(mode="after")
    def _lora_fits(self) -> "GRPOConfig":
        if self.lora_rank and self.zero_stage == 3:
            # ZeRO-3 would partition the model that peft wraps (adapters included), a path the trainer's
            # ZeRO-3 sampling and export have never been checked on; adapters are small, so ZeRO 0-2 loses little.
            raise ValueError("lora_rank > 0 needs zero_stage 0, 1 or 2 (LoRA with ZeRO-3 is not supported)")
        if self.max_staleness and (self.dynamic_sampling or self.adaptive_sampling):
            raise ValueError("max_staleness > 0 cannot be combined with dynamic_sampling or adaptive_sampling: "
                             "those decide from verified rewards while sampling, and the ahead sampler only samples")
        if self.policy_loss == "luspo" and self.loss_agg != "seq-mean-token-sum":
            raise ValueError(f"policy_loss luspo is gspo with each sequence's loss summed over its tokens: it needs "
                             f"loss_agg: seq-mean-token-sum (got {self.loss_agg})")
        if self.tis_min is not None and self.tis_cap is not None and not self.tis_min < self.tis_cap:
            raise ValueError(f"tis_min ({self.tis_min}) must be below tis_cap ({self.tis_cap})")
        if self.tis_cap is None and (self.tis_mode != "token_truncate" or self.tis_min is not None):
            raise ValueError("tis_mode / tis_min need tis_cap (the upper bound C_max), which turns the rollout "
                             "correction on")
        self._distill_fits()
        if self.adaptive_sampling and self.adaptive_max_samples < self.group_size:
            raise ValueError(f"adaptive_max_samples={self.adaptive_max_samples} is below group_size="
                             f"{self.group_size}, the first chunk: every prompt gets at least one chunk")
        return self

    @model_validator(mode="before")
    @classmethod
    def _servers_sample(cls, data: Any) -> Any:
        """A teacher on servers gives the sampled tokens' log-probs only: distill_estimator defaults to sampled."""
        if isinstance(data, dict) and data.get("distill_teacher_servers") and "distill_estimator" not in data:
            data = {**data, "distill_estimator": "sampled"}
        return data

    def _distill_fits(self) -> None:
        t = self.distill_teacher
        if t is None and (self.distill_weight != 1.0 or self.distill_teacher_revision is not None
                          or self.distill_estimator != "full" or self.distill_teacher_servers is not None):
            raise ValueError("distill_weight / distill_teacher_revision / distill_estimator / distill_teacher_servers "
                             "need distill_teacher (the teacher model), which turns on-policy distillation on")
        bad = [u for u in self.distill_teacher_servers or () if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"distill_teacher_servers: {bad[0]!r} is not an http(s):// URL")
        if self.distill_teacher_servers and self.distill_estimator == "full":
            raise ValueError("distill_teacher_servers give the teacher's log-probs of the sampled tokens only, not "
                             "whole distributions: use distill_estimator sampled (the default with servers) or score")
        if t is not None and t.startswith("run:") and not t[len("run:"):].strip("/"):
            raise ValueError("distill_teacher run:<run id> names no run")
        if self.distill_teacher_revision is not None and (t.startswith("run:") or not hub.is_hub_id(t)
                                                          or "@" in t):
            raise ValueError("distill_teacher_revision is for a hub id in distill_teacher (org/name), given once "
                             "(not also as org/name@revision)")


class ConfigDeprecation(FutureWarning):
    """A config key that moved (e.g. `grpo.micro_batch_size` -> `grpo.memory.micro_batch_size`): still read,
    with this one-line warning naming the new place. A FutureWarning, so users see it by default."""


_MOVED_SAID: dict = {}  # the warnings registry of `say_moved`: each line once per process (a sweep validates many)


def say_moved(old: str, new: str, source: str) -> None:
    """The one line `<source>:0: ConfigDeprecation: <old> is now <new>` (no source line under it: line 0)."""
    warnings.warn_explicit(f"{old} is now {new}", ConfigDeprecation, source, 0, registry=_MOVED_SAID)


def undeclared_key_fields(model: type[GRPOConfig] = GRPOConfig) -> list[str]:
    """Top-level GRPOConfig fields that are neither a section nor declared with `InKey` or `NamesRun`: each must say
    whether it names the training folder (tests/core/test_config_sections.py fails while one does not)."""
    declared = set(model.sections()) | set(key_fields(model))
    return [name for name in model.model_fields if name not in declared]


def grpo_key_dump(grpo: GRPOConfig) -> dict[str, Any]:
    """The GRPO settings that name the training folder (`rlvr_core.pipeline.train_stage`): every `InKey` and
    `NamesRun` field and the fields of every section declared `IN_KEY`, flat by their pre-section names, so the key
    (and the folder of every run trained before the sections existed) is unchanged. Sections declared out of the key
    are left out."""
    undeclared = undeclared_key_fields(type(grpo))
    if undeclared:
        raise TypeError(f"GRPOConfig fields {undeclared} declare neither InKey nor a section (nor NamesRun): the "
                        "training folder's key cannot tell whether they change the trained weights")
    sections = type(grpo).sections()
    out = grpo.model_dump(mode="json", exclude=set(sections))
    for name, sec in sections.items():
        if sec.IN_KEY:
            out.update(getattr(grpo, name).flat())
    return out


def grpo_unkeyed_dump(grpo: GRPOConfig) -> dict[str, Any]:
    """The settings of the sections declared out of the key, flat by their pre-section names (`micro_batch_size`,
    `launch`): what a training folder records and compares on resume (`_track_numerics`)."""
    return {k: v for name, sec in type(grpo).sections().items() if not sec.IN_KEY
            for k, v in getattr(grpo, name).flat().items()}


def moved_override(dotted: str, value: Any = None, source: str = "<overrides>") -> str:
    """A `--set` / sweep key by its current path: `grpo.micro_batch_size` -> `grpo.memory.micro_batch_size`
    (with the ConfigDeprecation line); any other key, and a whole section (`grpo.launch={...}`), as it is."""
    head, _, old = dotted.partition(".")
    moved = GRPOConfig.moved_keys().get(old) if head == "grpo" else None
    if moved is None or (old == moved[0] and isinstance(value, dict)):
        return dotted
    new = f"grpo.{moved[0]}.{moved[1]}"
    say_moved(dotted, new, source)
    return new
