"""Two-model guided decoding (seed 004): selective token replacement and test-time extrapolation.

`GuidedEngine` is the `hf` sampling engine with a second model: at each step both models see the same
prefix; the *proposal* model (A or B) draws a token y exactly as `HFEngine` would (same per-request
seed, same inverse-CDF draw), then a criterion on (p_A, p_B, y) decides whether to replace it with a
token drawn from the replacement distribution:

| criterion | replace when | paper (Huang et al. 2026, Alg. 1) |
|---|---|---|
| `dlogp` | Δlog p(y) = log p_B(y) - log p_A(y) < threshold (B disfavours the proposal) | logp difference |
| `entropy` | entropy of the proposal model's distribution > threshold | entropy |
| `kl` | (KL(p_A‖p_B) + KL(p_B‖p_A)) / 2 > threshold | averaged KL divergence |
| `random` | a uniform draw < threshold (threshold = the rate) | random baseline |
| `always` / `never` | every step / no step | — |

Replacement distributions: `b` (B's own distribution: selective token replacement) or `extrapolate`
with strength γ: log p_γ = log p_B + γ (log p_B - log p_A) - log Z, renormalised over the vocabulary
(p_γ ∝ p_B^(1+γ) p_A^(-γ); γ = 0 is p_B). Test-time extrapolation is proposal B, criterion `always`,
replacement `extrapolate`; the selective variant gates it with a criterion.

Randomness: the proposal draw uses the row's own generator, seeded like HFEngine's
(`request_seed(run seed, prompt id, step, sample index)`), so with criterion `never` and proposal A the
samples are HFEngine's samples of A, token for token (tested). The gate and replacement draws come
from a second generator per row, derived from the first, and are drawn at every step whether used or
not, so two criteria at the same seed share their random numbers (common random numbers: differences
between criteria are not sampling noise of the draws).

Criteria use the raw (temperature 1) distributions; the drawn distribution gets the sampling params'
temperature and top-p/top-k like HFEngine. `Sample.logprobs` are raw log-probs under the proposal model.
`replaced[(prompt_id, sample_index)]` holds how many of the sample's tokens were replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from rlvr_core.core.seeding import request_seed
from rlvr_core.probe.token_stats import token_stats_from_logits
from rlvr_core.sampling.base import Sample, SamplingParams
from rlvr_core.sampling.hf import HFEngine, _Row, left_padded, process_logits

__all__ = ["Guide", "GuidedEngine", "extrapolated_logprobs", "CRITERIA"]

CRITERIA = ("never", "always", "dlogp", "entropy", "kl", "random")


@dataclass(frozen=True)
class Guide:
    """The step rule of `GuidedEngine` (see the module docstring)."""

    proposal: Literal["a", "b"] = "a"
    criterion: Literal["never", "always", "dlogp", "entropy", "kl", "random"] = "never"
    threshold: float = 0.0
    replacement: Literal["b", "extrapolate"] = "b"
    gamma: float = 0.0

    def __post_init__(self) -> None:
        if self.proposal not in ("a", "b"):
            raise ValueError(f"proposal must be 'a' or 'b', got {self.proposal!r}")
        if self.criterion not in CRITERIA:
            raise ValueError(f"criterion must be one of {CRITERIA}, got {self.criterion!r}")
        if self.replacement not in ("b", "extrapolate"):
            raise ValueError(f"replacement must be 'b' or 'extrapolate', got {self.replacement!r}")


def extrapolated_logprobs(logits_a: torch.Tensor, logits_b: torch.Tensor, gamma: float) -> torch.Tensor:
    """log p_γ = log p_B + γ (log p_B - log p_A) - log Z. (B, V) logits -> (B, V) log-probs (float32+)."""
    la = torch.log_softmax(logits_a.float(), -1)
    lb = torch.log_softmax(logits_b.float(), -1)
    return torch.log_softmax(lb + gamma * (lb - la), -1)


def _inverse_cdf(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """HFEngine's draw: first index whose float64 CDF exceeds u * total. (B, V), (B,) -> (B,)."""
    cdf = torch.softmax(logits, dim=-1).double().cumsum(dim=-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    return idx.clamp(max=logits.shape[-1] - 1)


class GuidedEngine(HFEngine):
    """HFEngine over model A with a second model B and a `Guide` (same interface: `generate`)."""

    name = "guided"

    def __init__(self, model_a, model_b, tokenizer, guide: Guide, **kwargs):
        super().__init__(model_a, tokenizer, **kwargs)
        self.model_b = model_b.to(self.device).eval()
        self.guide = guide
        self.replaced: dict[tuple[str, int], tuple[int, int]] = {}

    def _to_sample(self, row: _Row, prompt_id: str, params: SamplingParams) -> Sample:
        self.replaced[(prompt_id, row.sample_index)] = (getattr(row, "n_replaced", 0), len(row.tokens))
        return super()._to_sample(row, prompt_id, params)

    @torch.inference_mode()
    def _decode_batch(self, rows: list[_Row], params: SamplingParams) -> None:
        if params.greedy:
            raise ValueError("guided decoding samples (temperature > 0); greedy has no draws to replace")
        g = self.guide
        dev = self.device
        input_ids, attention_mask, position_ids = left_padded(rows, self.pad_token_id, dev)
        side: list[torch.Generator] = []
        for r in rows:
            r.generator = torch.Generator(device=dev)
            r.generator.manual_seed(r.seed)
            r.n_replaced = 0
            s = torch.Generator(device=dev)
            s.manual_seed(request_seed(r.seed, "rlvr.probe.guided", 0, 0))
            side.append(s)

        kw = dict(attention_mask=attention_mask, position_ids=position_ids, use_cache=True, **self._prefill_kwargs)
        out_a, out_b = self.model(input_ids=input_ids, **kw), self.model_b(input_ids=input_ids, **kw)
        past_a, past_b = out_a.past_key_values, out_b.past_key_values
        la, lb = out_a.logits[:, -1, :].float(), out_b.logits[:, -1, :].float()
        next_pos = position_ids[:, -1:] + 1
        active = list(rows)
        gens = list(side)
        stop_window = self._stop_window(params.stop)

        def draw(gs: list[torch.Generator]) -> torch.Tensor:
            return torch.stack([torch.rand((), generator=x, device=dev, dtype=torch.float64) for x in gs])

        for _ in range(params.max_new_tokens):
            prop_logits = la if g.proposal == "a" else lb
            y = _inverse_cdf(process_logits(prop_logits, params.temperature, params.top_k, params.top_p),
                             draw([r.generator for r in active]))
            u_gate, u_repl = draw(gens), draw(gens)  # always drawn: aligned streams across criteria
            st = token_stats_from_logits(la, lb, y, vocab_chunk=la.shape[-1])
            if g.criterion == "never":
                gate = torch.zeros_like(y, dtype=torch.bool)
            elif g.criterion == "always":
                gate = torch.ones_like(y, dtype=torch.bool)
            elif g.criterion == "dlogp":
                gate = st.dlogp < g.threshold
            elif g.criterion == "entropy":
                gate = (st.entropy_a if g.proposal == "a" else st.entropy_b) > g.threshold
            elif g.criterion == "kl":
                gate = st.kl_sym > g.threshold
            else:
                gate = u_gate < g.threshold
            gate = gate.to(dev)
            if bool(gate.any()):
                repl_logits = lb if g.replacement == "b" else extrapolated_logprobs(la, lb, g.gamma)
                y_new = _inverse_cdf(process_logits(repl_logits, params.temperature, params.top_k, params.top_p), u_repl)
                y = torch.where(gate, y_new, y)
            raw = torch.log_softmax(prop_logits, dim=-1).gather(-1, y[:, None])[:, 0].tolist()
            keep: list[int] = []
            for b, (r, tok, lp, rep) in enumerate(zip(active, y.tolist(), raw, gate.tolist())):
                r.n_replaced += int(rep)
                if not self._append(r, tok, lp, params, stop_window):
                    keep.append(b)
            if not keep:
                return
            tokens = y
            if len(keep) < len(active):
                idx = torch.tensor(keep, device=dev)
                past_a.batch_select_indices(idx)
                past_b.batch_select_indices(idx)
                attention_mask, next_pos, tokens = attention_mask[idx], next_pos[idx], tokens[idx]
                active = [active[b] for b in keep]
                gens = [gens[b] for b in keep]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(active), 1))], dim=-1)
            step_kw = dict(attention_mask=attention_mask, position_ids=next_pos, use_cache=True)
            out_a = self.model(input_ids=tokens[:, None], past_key_values=past_a, **step_kw)
            out_b = self.model_b(input_ids=tokens[:, None], past_key_values=past_b, **step_kw)
            past_a, past_b = out_a.past_key_values, out_b.past_key_values
            la, lb = out_a.logits[:, -1, :].float(), out_b.logits[:, -1, :].float()
            next_pos = next_pos + 1
