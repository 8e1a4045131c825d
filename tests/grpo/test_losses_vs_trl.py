"""Our GRPO losses and advantage estimators against TRL's own code (TRL's `GRPOTrainer`, same inputs).

The other GRPO tests check `grpo_loss` / the estimators against loops we wrote ourselves; a formula misread
the same way in both places passes them. Here the reference is TRL's real code path, driven end to end on
a real (tiny, randomly initialised, built locally, nothing downloaded) Qwen2 model:

    1. a `GRPOTrainer` (single CPU process, float32, `num_iterations=2` so it computes the old log-probs
       itself) gets fixed rollouts through its own `rollout_func` hook (prompt/completion token ids with
       ragged completion lengths; no generation) and fixed rewards through a reward function, and
       `_generate_and_score_completions` builds the batch exactly as in training: padding and masks,
       `old_per_token_logps` (policy before the update), `ref_per_token_logps` (a reference model TRL loads
       itself when beta > 0), `num_items_in_batch` and the group-normalised **advantages**;
    2. the policy weights then move (a fixed random perturbation standing in for one optimiser step), so
       the ratio pi_theta / pi_old leaves 1 and PPO clipping acts on both sides;
    3. TRL's `_compute_loss(model, inputs)` gives the loss, `torch.autograd.grad` its gradient w.r.t. every
       model parameter.
Our side uses only our code on the same tokens and model: `build_batch` + `sequence_logprobs` (teacher
forcing, the trainer's path) for the current, old and reference log-probs, `get_advantage` on the (K, G)
reward matrix, and `grpo_loss`. Loss values, gradients, advantages, old/ref log-probs and clip/KL metrics
are compared.

Option mapping (TRL 1.16 `GRPOConfig` -> ours):
    loss_type="grpo"     -> agg_mode="seq-mean-token-mean"      (per-sequence token mean, then mean over B)
    loss_type="bnpo"     -> agg_mode="token-mean"               (tokens of this micro-batch)
    loss_type="dapo"     -> agg_mode="token-mean", num_tokens = TRL's num_items_in_batch (whole generation
                            batch, which is what our num_tokens is for under gradient accumulation)
    loss_type="dr_grpo"  -> agg_mode="seq-mean-token-sum-norm", norm_len=max_completion_length
    epsilon / epsilon_high -> clip_low / clip_high;   beta -> beta with kl_estimator="k3"
    TRL gradient accumulation (loss / steps, or / global tokens for dapo) -> our num_seqs / num_tokens
    scale_rewards="group" -> get_advantage("grpo", eps=1e-4);  scale_rewards="none" -> get_advantage("dr_grpo")

Known design differences, pinned by tests below rather than hidden by tolerances:
    * TRL's advantage epsilon is 1e-4, ours defaults to 1e-6 (verl's); the comparison passes eps=1e-4.
    * TRL >= 1.x defaults `use_bias_correction_kl=True`: the per-token k3 KL is multiplied by the importance
      ratio pi_theta / pi_old (not detached). Ours has no such option: our KL term is TRL's with
      `use_bias_correction_kl=False`, which the main comparison sets. `test_trl_default_kl_bias_correction`
      shows the difference is exactly beta * aggregate((ratio - 1) * k3) and nothing else.
    * TRL's `scale_rewards="batch"` (group mean, batch std) has no counterpart among our estimators; not compared.
    * Equal prompt lengths are used: TRL left-pads prompts and passes no position_ids, our `build_batch`
      right-pads with explicit positions; with equal prompt lengths both layouts are the same tensor, so the
      comparison tests the loss maths, not the padding convention.

Advantages are inline in `GRPOTrainer._generate_and_score_completions` (trl/trainer/grpo_trainer.py,
the `scale_rewards` block, ~line 2760: `nanstd` with Bessel correction, `(r - mean) / (std + 1e-4)`), not a
separate function, which is why they are driven through that method rather than called directly.
"""

from __future__ import annotations

import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is not installed: the cross-check against TRL's GRPOTrainer needs it")
datasets = pytest.importorskip("datasets", reason="datasets (a TRL dependency) is not installed")

from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.trainer.utils import split_tensor_dict  # noqa: E402

from rlvr_core.grpo.advantages import get_advantage  # noqa: E402
from rlvr_core.grpo.kl import kl_k3  # noqa: E402
from rlvr_core.grpo.losses import aggregate_loss, grpo_loss, mask_from_lengths  # noqa: E402
from rlvr_core.grpo.logprobs import sequence_logprobs  # noqa: E402
from rlvr_core.grpo.update import build_batch  # noqa: E402

K, G = 3, 4                     # prompts x completions per prompt
B = K * G
PROMPT_LEN = 5
MAX_LEN = 10                    # max_completion_length (Dr.GRPO's constant normaliser)
# ragged, 1..9: the padded width (9) differs from MAX_LEN, so using it as Dr.GRPO's constant would show
LENGTHS = [9, 3, 1, 7, 5, 9, 2, 6, 4, 8, 1, 5]
EPS_LOW, EPS_HIGH = 0.2, 0.28
BETA = 0.05
ADV_EPS_TRL = 1e-4
N_SPECIAL = 3                   # <pad>, <eos>, <unk>
VOCAB = 48

# TRL loss_type -> our grpo_loss options (num_tokens is filled in per batch for dapo)
OURS = {
    "grpo": dict(agg_mode="seq-mean-token-mean"),
    "bnpo": dict(agg_mode="token-mean"),
    "dapo": dict(agg_mode="token-mean"),
    "dr_grpo": dict(agg_mode="seq-mean-token-sum-norm", norm_len=MAX_LEN),
}


# ---- a tiny local model + tokenizer ---------------------------------------------------------------------------

def _tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i for i in range(N_SPECIAL, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    tok = _tokenizer()
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
                      tie_word_embeddings=False)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # sharper than the init's near-uniform logits
        model.lm_head.weight.mul_(20.0)
    d = tmp_path_factory.mktemp("tiny_qwen2")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module", autouse=True)
def _env():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")               # the reference model is loaded from model_dir, never fetched
        mp.setenv("TRL_EXPERIMENTAL_SILENCE", "1")     # rollout_func is flagged experimental
        yield


# ---- the planned rollout: tokens and rewards ------------------------------------------------------------------

def _plan(seed: int):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(N_SPECIAL, VOCAB, (PROMPT_LEN,), generator=g).tolist() for _ in range(K)]
    prompt_tokens = [prompts[i // G] for i in range(B)]
    completion_tokens = [torch.randint(N_SPECIAL, VOCAB, (n,), generator=g).tolist() for n in LENGTHS]
    rewards = torch.rand(K, G, generator=g)
    rewards[0] = (rewards[0] > 0.5).float()      # a binary (verifier-like) group
    rewards[0, :2] = torch.tensor([0.0, 1.0])    # ... with both outcomes
    return prompt_tokens, completion_tokens, rewards


class _Plan:
    """What the trainer's rollout_func and reward function hand back on the next call."""

    def __init__(self):
        self.prompt_tokens = self.completion_tokens = self.rewards = None

    def rollout(self, prompts, trainer):
        assert len(prompts) == B
        return {"prompt_ids": [list(p) for p in self.prompt_tokens],
                "completion_ids": [list(c) for c in self.completion_tokens],
                # sampler log-probs: only used by TRL for vLLM importance sampling, which is off here
                "logprobs": [[0.0] * len(c) for c in self.completion_tokens]}

    def reward(self, prompts, completions, **kwargs):
        assert len(completions) == B
        return self.rewards.reshape(-1).tolist()


def _make_trainer(model_dir, tmp_path, plan: _Plan, *, loss_type="dapo", beta=0.0, scale_rewards="group",
                  grad_accum=1, bias_correction_kl=False) -> GRPOTrainer:
    args = GRPOConfig(
        output_dir=str(tmp_path / f"trl-{loss_type}-{beta}-{scale_rewards}-{grad_accum}"),
        loss_type=loss_type, beta=beta, epsilon=EPS_LOW, epsilon_high=EPS_HIGH, scale_rewards=scale_rewards,
        max_completion_length=MAX_LEN, num_generations=G, per_device_train_batch_size=B // grad_accum,
        gradient_accumulation_steps=grad_accum, num_iterations=2, temperature=1.0,
        use_bias_correction_kl=bias_correction_kl, use_cpu=True, bf16=False, fp16=False, report_to=[],
        disable_dropout=True, save_strategy="no", logging_strategy="no", seed=0,
    )
    policy = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    train = datasets.Dataset.from_dict({"prompt": [f"w{i}" for i in range(N_SPECIAL, N_SPECIAL + K)]})

    def planned_reward(prompts, completions, **kwargs):
        return plan.reward(prompts, completions, **kwargs)

    trainer = GRPOTrainer(model=policy, reward_funcs=planned_reward, args=args, train_dataset=train,
                          processing_class=tok, rollout_func=plan.rollout)
    trainer.current_gradient_accumulation_steps = grad_accum  # set by Trainer's training loop otherwise
    return trainer


def _perturb(model, seed: int, scale: float) -> None:
    """A fixed random step on every parameter (stands in for an optimiser update)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * (p.detach().abs().mean() + 1e-3))


def _generation_inputs():
    return [{"prompt": f"w{N_SPECIAL + i // G}"} for i in range(B)]


# ---- one scenario, both sides -----------------------------------------------------------------------------------

def _run(model_dir, tmp_path, *, loss_type, beta, grad_accum=1, bias_correction_kl=False, seed=1,
         our_loss_type=None):
    """TRL's loss/grad on the planned batch and ours on the same tokens and weights.

    Returns a dict with trl_loss, our_loss, trl_grads, our_grads, the TRL batch and our metrics."""
    plan = _Plan()
    plan.prompt_tokens, plan.completion_tokens, plan.rewards = _plan(seed)
    trainer = _make_trainer(model_dir, tmp_path, plan, loss_type=loss_type, beta=beta, grad_accum=grad_accum,
                            bias_correction_kl=bias_correction_kl)
    model = trainer.model
    model.train()
    _perturb(model, seed + 100, 0.05)                   # the policy has drifted from the reference

    batch = build_batch(plan.prompt_tokens, plan.completion_tokens, pad_id=0)
    mask = mask_from_lengths(batch["lengths"], batch["targets"].shape[1])
    with torch.no_grad():
        trl_inputs = trainer._generate_and_score_completions(_generation_inputs())
        our_old, _ = sequence_logprobs(model, batch)
        our_ref = None
        if beta > 0:
            ref = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
            our_ref, _ = sequence_logprobs(ref, batch)
    _perturb(model, seed + 200, 0.15)                   # the "update": ratios leave 1, both clip sides bite

    params = [p for p in model.parameters() if p.requires_grad]

    # TRL: its micro-batches (split_tensor_dict is what _prepare_inputs uses), loss summed over them as the
    # accumulated gradient is
    micro = split_tensor_dict(trl_inputs, grad_accum)
    trl_loss = sum(trainer._compute_loss(model, mb) for mb in micro)
    trl_grads = torch.autograd.grad(trl_loss, params)

    # ours: same split (contiguous, in order), global normalisers for accumulation
    our_adv = get_advantage("grpo")(plan.rewards, eps=ADV_EPS_TRL).reshape(-1)
    ours = our_loss_type or loss_type
    opts = dict(OURS[ours])
    scale = 1.0
    if ours == "bnpo":
        # BNPO is the token mean of each micro-batch, averaged over the accumulation steps: our token-mean
        # *without* global num_tokens, over grad_accum
        scale = 1.0 / grad_accum
    elif grad_accum > 1:
        opts["num_seqs"] = float(B)
        opts["num_tokens"] = float(mask.sum())
    elif ours == "dapo":
        opts["num_tokens"] = float(trl_inputs["num_items_in_batch"])
    logp, _ = sequence_logprobs(model, batch)
    n = B // grad_accum
    our_loss, metrics = 0.0, []
    for i in range(grad_accum):
        s = slice(i * n, (i + 1) * n)
        loss_i, m_i = grpo_loss(logp[s], our_old[s], our_adv[s], mask[s],
                                ref_logp=None if our_ref is None else our_ref[s], beta=beta, kl_estimator="k3",
                                clip_low=EPS_LOW, clip_high=EPS_HIGH, **opts)
        our_loss = our_loss + scale * loss_i
        metrics.append(m_i)
    our_grads = torch.autograd.grad(our_loss, params)
    return dict(trainer=trainer, trl_inputs=trl_inputs, trl_loss=trl_loss.detach(), our_loss=our_loss.detach(),
                trl_grads=trl_grads, our_grads=our_grads, metrics=metrics, our_old=our_old, our_ref=our_ref,
                our_adv=our_adv, mask=mask, logp=logp.detach())


def _flat(grads) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads])


def _assert_grads_close(ours, theirs, rtol=1e-5):
    a, b = _flat(ours), _flat(theirs)
    assert torch.isfinite(b).all() and b.norm() > 0
    rel = ((a - b).norm() / b.norm()).item()
    assert rel < rtol, f"gradient mismatch: |g_ours - g_trl| / |g_trl| = {rel:.3e}"
    # and elementwise, relative to the largest entry (a global norm can hide one wrong block)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=rtol * b.abs().max().item())


# ---- the tests --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("beta", [0.0, BETA], ids=["no-kl", "kl-k3"])
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo"])
def test_loss_and_grad_match_trl(model_dir, tmp_path, loss_type, beta):
    r = _run(model_dir, tmp_path, loss_type=loss_type, beta=beta)
    inp, mask = r["trl_inputs"], r["mask"]

    # same batch layout as TRL builds it (equal prompt lengths, right-padded completions, mask from lengths)
    assert torch.equal(inp["completion_mask"].bool(), mask)
    # TRL's old / ref log-probs (its fused chunked LM head) vs our teacher-forced log_softmax on the same weights
    torch.testing.assert_close(torch.where(mask, inp["old_per_token_logps"], 0.0),
                               torch.where(mask, r["our_old"], 0.0), rtol=0, atol=2e-5)
    if beta > 0:
        torch.testing.assert_close(torch.where(mask, inp["ref_per_token_logps"], 0.0),
                                   torch.where(mask, r["our_ref"], 0.0), rtol=0, atol=2e-5)
    torch.testing.assert_close(inp["advantages"], r["our_adv"], rtol=0, atol=1e-6)

    m = r["metrics"][0]
    # the regime the test claims to cover: clipping on both sides, a real KL to the reference
    assert m["clip_frac_low"] > 0 and m["clip_frac_high"] > 0, m
    if beta > 0:
        assert m["kl_ref_mean"] > 1e-3, m

    torch.testing.assert_close(r["our_loss"], r["trl_loss"], rtol=1e-5, atol=1e-6)
    _assert_grads_close(r["our_grads"], r["trl_grads"])

    # TRL's logged clip fractions / KL (token means over the batch) are the same quantities as our metrics
    tm = r["trainer"]._metrics["train"]
    assert tm["clip_ratio/low_mean"][-1] == pytest.approx(float(m["clip_frac_low"]), abs=1e-6)
    assert tm["clip_ratio/high_mean"][-1] == pytest.approx(float(m["clip_frac_high"]), abs=1e-6)
    assert tm["clip_ratio/region_mean"][-1] == pytest.approx(float(m["clip_frac"]), abs=1e-6)
    if beta > 0:
        assert tm["kl"][-1] == pytest.approx(float(m["kl_ref_mean"]), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo"])
def test_grad_accumulation_matches_trl(model_dir, tmp_path, loss_type):
    """Two micro-batches: TRL divides by the accumulation steps (grpo, dr_grpo, bnpo) or by the generation
    batch's token count (dapo); ours gets the whole batch's num_seqs / num_tokens (bnpo: the micro-batch's own
    token count, over the steps). Summed losses and grads agree."""
    r = _run(model_dir, tmp_path, loss_type=loss_type, beta=BETA, grad_accum=2)
    torch.testing.assert_close(r["our_loss"], r["trl_loss"], rtol=1e-5, atol=1e-6)
    _assert_grads_close(r["our_grads"], r["trl_grads"])


def test_wrong_aggregation_is_detected(model_dir, tmp_path):
    """The comparison has teeth: our GRPO aggregation against TRL's DAPO loss must disagree."""
    r = _run(model_dir, tmp_path, loss_type="dapo", beta=0.0, our_loss_type="grpo")
    assert abs(float(r["our_loss"] - r["trl_loss"])) > 1e-3


def test_trl_default_kl_bias_correction(model_dir, tmp_path):
    """Design difference, not a bug: TRL's default `use_bias_correction_kl=True` weights the k3 term by the
    (non-detached) ratio pi_theta / pi_old; ours has no such option. The whole difference is
    beta * aggregate((ratio - 1) * k3), computed here with our own functions."""
    on = _run(model_dir, tmp_path, loss_type="grpo", beta=BETA, bias_correction_kl=True)
    off_loss = on["our_loss"]  # ours == TRL with the correction off (test_loss_and_grad_match_trl)
    mask = on["mask"]
    ratio = torch.exp(on["logp"] - on["our_old"])
    k3 = kl_k3(on["logp"], on["our_ref"])
    extra = BETA * aggregate_loss((ratio - 1) * k3, mask, "seq-mean-token-mean")
    assert abs(float(on["trl_loss"] - off_loss)) > 1e-6           # the difference is really there ...
    torch.testing.assert_close(on["trl_loss"], off_loss + extra, rtol=1e-5, atol=1e-6)  # ... and is only that


# ---- advantages ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def adv_trainers(model_dir, tmp_path_factory):
    plans, trainers = {}, {}
    tmp = tmp_path_factory.mktemp("trl-adv")
    for scale in ("group", "none"):
        plans[scale] = _Plan()
        trainers[scale] = _make_trainer(model_dir, tmp, plans[scale], scale_rewards=scale)
    return plans, trainers


def _adv_rewards(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(K, G, generator=g) * 3 + 1
    r[1] = torch.tensor([1.0, 1.0, 1.0, 1.0])        # zero spread: advantage 0 in both
    r[2] = torch.tensor([0.0, 1.0, 1.0, 0.0]) if seed % 2 else torch.tensor([0.0, 0.0, 0.0, 1.0])
    return r


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("scale_rewards,ours", [("group", "grpo"), ("none", "dr_grpo")])
def test_advantages_match_trl(adv_trainers, scale_rewards, ours, seed):
    plans, trainers = adv_trainers
    plan, trainer = plans[scale_rewards], trainers[scale_rewards]
    plan.prompt_tokens, plan.completion_tokens, _ = _plan(seed)
    plan.rewards = _adv_rewards(seed)
    with torch.no_grad():
        trl_adv = trainer._generate_and_score_completions(_generation_inputs())["advantages"]
    our_adv = get_advantage(ours)(plan.rewards, eps=ADV_EPS_TRL).reshape(-1)
    torch.testing.assert_close(our_adv, trl_adv, rtol=1e-6, atol=1e-6)
    # also in the flat (B*G,) layout with group_size, the trainer's other entry point
    torch.testing.assert_close(get_advantage(ours)(plan.rewards.reshape(-1), G, eps=ADV_EPS_TRL), trl_adv,
                               rtol=1e-6, atol=1e-6)
    if scale_rewards == "group":
        # std with Bessel's correction matters: the population std gives different advantages
        pop = (plan.rewards - plan.rewards.mean(1, keepdim=True)) / (plan.rewards.std(1, correction=0, keepdim=True)
                                                                     + ADV_EPS_TRL)
        assert not torch.allclose(pop.reshape(-1), trl_adv, atol=1e-3)


# ---- rollout-correction weights: TRL's vLLM importance-sampling block, driven through the trainer -------------

@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_correction_weights_match_trl(model_dir, tmp_path, mode):
    """TRL computes its importance-sampling ratio inline in `_generate_and_score_completions`, only with vLLM.
    The trainer is switched to that path after construction (use_vllm and the correction on; no vLLM is
    reached: the rollout_func hook supplies the sampler's log-probs, and the weight sync is marked done), with
    the sampler's log-probs planted as the trainer's own (its old_per_token_logps) plus noise. Our
    `correction_weights` on the same two log-prob tensors gives TRL's ratio on every response token (sequence
    modes: ratio "product", TRL's sum of token log-ratios)."""
    from rlvr_core.grpo.rollout_correction import correction_weights

    plan = _Plan()
    plan.prompt_tokens, plan.completion_tokens, plan.rewards = _plan(4)
    trainer = _make_trainer(model_dir, tmp_path, plan)
    with torch.no_grad():  # the trainer's own log-probs of the planned tokens
        trainer.use_vllm = False
        own = trainer._generate_and_score_completions(_generation_inputs())["old_per_token_logps"]
    g = torch.Generator().manual_seed(11)
    noise = torch.randn(own.shape, generator=g) * (0.25 if mode.startswith("token") else 0.1)
    sampler = [(own[b, :n] + noise[b, :n]).tolist() for b, n in enumerate(LENGTHS)]
    plan.rollout = lambda prompts, tr: {"prompt_ids": [list(p) for p in plan.prompt_tokens],
                                        "completion_ids": [list(c) for c in plan.completion_tokens],
                                        "logprobs": sampler}
    trainer.rollout_func = plan.rollout
    c_min, c_max = (0.8, 1.25) if mode.startswith("token") else (0.7, 1.4)
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    trainer.vllm_importance_sampling_mode = mode
    trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max = c_min, c_max
    trainer._last_loaded_step = trainer.state.global_step  # no weight sync to a vLLM that is not there
    with torch.no_grad():
        out = trainer._generate_and_score_completions(_generation_inputs())
    trl_ratio, trainer_lp = out["importance_sampling_ratio"], out["old_per_token_logps"]
    mask = out["completion_mask"].bool()
    rollout = torch.zeros_like(trainer_lp)
    for b, row in enumerate(sampler):
        rollout[b, :len(row)] = torch.tensor(row)
    w, keep, tis = correction_weights(trainer_lp, rollout, mask, mode=mode, c_min=c_min, c_max=c_max,
                                      seq_ratio="product")
    expect = trl_ratio.expand(mask.shape)
    torch.testing.assert_close(w[mask], expect[mask].to(w.dtype), rtol=1e-6, atol=1e-6)
    hit = tis["tis/masked_share"] if mode.endswith("mask") else tis["tis/clipped_share"]
    assert 0 < hit < 1, (mode, tis)  # both sides of the bounds are exercised
    assert torch.equal(keep, mask & (w > 0)) if mode.endswith("mask") else torch.equal(keep, mask)
