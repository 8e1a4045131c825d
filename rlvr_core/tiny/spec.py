"""The warm start's settings, importable without torch: a pipeline whose base model is cached (every trial of a
sweep after the first) keys its cache on these and never loads the trainer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WarmStartSpec:
    steps: int = 160  # tuned: 20-38% greedy on the d=1 test split over seeds 0-2; see docs/tiny_model.md
    batch_size: int = 32
    lr: float = 3e-3
    seed: int = 0
    warmup_steps: int = 20  # linear warmup, then cosine decay to min_lr_ratio * lr
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    vocab_size: int = 512
    hidden_size: int = 128
    num_layers: int = 4
    heads: int = 4
    intermediate_size: int | None = None  # None: 4 * hidden_size
    progress_every: int = 10  # call progress(step, total, loss) every N steps (and at the last step)
    num_threads: int | None = None  # torch intra-op threads during training (restored afterwards); None: leave
    # A weak teacher: the share of subtraction steps whose demonstration reads the step as an addition
    # ("gives 2 to Ann" → "7 + 2 = 9"), drawn per step; later lines follow the misread running total.
    teacher_sub_as_add: float = 0.0
    # A hasty teacher: the share of demonstrations that stop one step early, with "#### <that total>"
    # (the question's last change is never applied).
    teacher_stops_early: float = 0.0
    # A teacher of the products task: the share of demonstrations that call the calculator (the rest answer at once).
    teacher_tool_share: float = 0.0
