"""Typed experiment configuration: YAML in, validated pydantic models out, before any expensive work.

Why so strict: a misspelt key in a hand-rolled script silently falls back to a default (the seeds ran
for days with settings nobody had asked for). Here every model forbids unknown keys, every field has
help text, and a bad file fails with one message naming the file, the field path and the reason.
Every run stores its resolved config (defaults filled in) and a stable hash of it.

One idea, the schema and its loading: the sections of an experiment file (the `grpo:` section's in
`grpo_config.py`, `sampling:` in `sampling_config.py`, the shared base in `config_base.py`), reading YAML with overrides, and `DEMO_SETTINGS`.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from rlvr_core.core import hub
from rlvr_core.data.curriculum import known_orderings
from rlvr_core.data.templates import get_template, known_templates
from rlvr_core.experiment.config_base import AddedLater, ConfigError, InKey, NamesRun, Strict, one_of
from rlvr_core.experiment.environment_config import EnvironmentConfig
from rlvr_core.experiment.grpo_config import moved_override as moved_grpo_key
from rlvr_core.experiment.grpo_config import GRPOConfig, say_moved
from rlvr_core.experiment.push_config import PUSH_TYPES, moved_push_key
from rlvr_core.experiment.sampling_config import SamplingConfig
from rlvr_core.verifiers.registry import can_hang, default_workers, verifier_class


class SyntheticDataConfig(AddedLater):
    _ADDED_LATER: ClassVar[tuple[str, ...]] = ("task", "digits")

    n_train: int = Field(2000, ge=1, description="training problems to generate")
    n_test: int = Field(200, ge=1, description="held-out problems to generate")
    seed: int = Field(0, description="seed of the generator; train and test are disjoint for any seed")
    difficulty: int = Field(1, ge=1, le=5, description="1 = the demo's level; higher = bigger numbers, more steps")
    task: Literal["word_problems", "products"] = Field("word_problems", description="word_problems (the demo's "
                                                       "GSM8K-form stories) or products (\"What is 347 * 28?\": "
                                                       "the tool demo, docs/environments.md)")
    digits: list[int] = Field(default_factory=lambda: [3, 2], min_length=2, max_length=2,
                              description="products: the digit counts of the two factors")


class DataConfig(Strict):
    source: Literal["synthetic", "jsonl", "gsm8k", "math500", "minerva_math", "aime24", "amc23", "svamp",
                    "asdiv", "aqua", "mmlu_stem", "ifeval", "hendrycks_math"] = Field(
        "synthetic", description="'synthetic' generates the demo task; other names load that data set from `train_path`")
    train_path: str | None = Field(None, description="jsonl file of training problems (for non-synthetic sources)")
    test_path: str | None = Field(None, description="jsonl file of held-out problems (for non-synthetic sources)")
    benchmark: str | None = Field(None, description="instead of train_path/test_path: the benchmark file "
                                  "(configs/benchmarks/<name>.yaml) whose data to use: its `train` split for training "
                                  "and its evaluated split as held-out set, each from the data root, else the "
                                  "Hugging Face cache, else its hub copy (data.hub; `rlvr pull config` fetches them)")
    synthetic: SyntheticDataConfig = Field(default_factory=SyntheticDataConfig)

    @model_validator(mode="after")
    def _paths_for_files(self) -> "DataConfig":
        if self.benchmark is not None:
            if self.source == "synthetic":
                raise ValueError("data.benchmark names a real data set: set data.source to its source (e.g. gsm8k)")
            if self.train_path or self.test_path:
                raise ValueError("data.benchmark replaces train_path and test_path: give one or the other")
            return self
        # No fallback of test to train: evaluating on training prompts would inflate every score silently.
        missing = [f for f in ("train_path", "test_path") if self.source != "synthetic" and not getattr(self, f)]
        if missing:
            raise ValueError(f"source {self.source!r} needs {' and '.join(missing)}")
        return self


class TinyModelConfig(Strict):
    """The demo's model: built from a config, tokenizer trained locally, nothing downloaded."""

    vocab_size: int = Field(512, ge=260, le=8192, description="byte-level BPE vocabulary size")
    hidden_size: int = Field(128, ge=16, description="transformer width")
    num_layers: int = Field(4, ge=1, description="decoder layers")
    num_heads: int = Field(4, ge=1, description="attention heads")


class WarmStartConfig(AddedLater):
    _ADDED_LATER: ClassVar[tuple[str, ...]] = ("teacher_tool_share",)

    """Short supervised warm start that turns the random tiny model into a weak-but-not-hopeless base."""

    steps: int = Field(160, ge=1, description="optimizer steps of supervised fine-tuning (160: ~26% greedy held-out accuracy, see docs/tiny_model.md)")
    batch_size: int = Field(32, ge=1, description="problems per step")
    lr: float = Field(3e-3, gt=0, description="peak learning rate")
    seed: int = Field(0, description="initialisation and data-order seed")
    teacher_sub_as_add: float = Field(
        0.0, ge=0.0, le=1.0,
        description="synthetic data only: share of subtraction steps the supervised demonstrations misread as "
                    "additions (a weak teacher whose mistakes RL with a verifier can undo; docs/tiny_model.md)")
    teacher_tool_share: float = Field(
        0.0, ge=0.0, le=1.0,
        description="products data only: share of supervised demonstrations that call the calculator; the rest "
                    "answer at once, in the head (the tool demo: RL raises the tool-call rate, docs/environments.md)")
    teacher_stops_early: float = Field(
        0.0, ge=0.0, le=1.0,
        description="synthetic data only: share of supervised demonstrations that stop one step early and answer "
                    "with that total (a hasty teacher; docs/tiny_model.md)")


class ModelConfig(Strict):
    source: Literal["tiny", "hf"] = Field("tiny", description="'tiny' builds and warm-starts the demo model; 'hf' loads `path`")
    path: str | None = Field(None, description="source hf: a local Hugging Face model directory, or a hub id "
                             "(org/name, e.g. Qwen/Qwen2.5-0.5B) fetched into the Hugging Face cache ($HF_HOME) "
                             "unless HF_HUB_OFFLINE is set (then `rlvr pull model` it first)")
    revision: str | None = Field(None, description="hub id only: the commit (recommended), branch or tag to use; "
                                 "None = the default branch. A branch is resolved to its commit when first fetched; "
                                 "the commit and file hashes go into the run manifest")
    kind: Literal["base", "chat"] = Field("base", description="base models get raw prompts; chat models a chat template (G-chat-template)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="weights dtype for sampling and training")
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)

    @model_validator(mode="after")
    def _path_for_hf(self) -> "ModelConfig":
        if self.source == "hf" and not self.path:
            raise ValueError("source 'hf' needs path (a local model directory or a hub id such as Qwen/Qwen2.5-0.5B)")
        if self.revision is not None and (self.source != "hf" or not hub.is_hub_id(self.path or "")):
            raise ValueError("revision is for a hub id in model.path (source hf), not a local directory")
        if self.revision is not None and "@" in (self.path or ""):
            raise ValueError("give the revision once: in model.revision or as path@revision, not both")
        return self

    def hub_ref(self) -> tuple[str, str | None] | None:
        """(repo, revision) when the model comes from the hub, else None."""
        if self.source != "hf" or not self.path or not hub.is_hub_id(self.path):
            return None
        repo, rev = hub.split_ref(self.path)
        return repo, rev or self.revision


class PromptConfig(Strict):
    template: str = Field("qa", description="prompt template id (see rlvr_core.data.templates); part of every result. "
                          "Its kind (base or chat) must be model.kind (G-chat-template)")
    allow_kind_mismatch: bool = Field(False, description="use a template whose kind differs from model.kind on "
                                      "purpose (e.g. a raw 'Question: ...' prompt on a chat model, as zero-RL recipes "
                                      "do); the stages then log the mismatch and write it to the run summary instead "
                                      "of refusing the config (G-chat-template). A chat template on a base model is "
                                      "refused even so: a base tokenizer cannot render it")

    @field_validator("template")
    @classmethod
    def _known(cls, v: str) -> str:
        return one_of(v, known_templates(), "template")


class PassKConfig(Strict):
    n_samples: int = Field(8, ge=1, description="completions per training prompt used to estimate pass rates")
    ks: list[int] = Field(default_factory=lambda: [1, 2, 4, 8], description="k values reported (each ≤ n_samples)")
    max_prompts: int | None = Field(128, ge=1, description="measure at most this many training prompts (None = all)")
    low: float = Field(0.0, ge=0, le=1, description="keep prompts with pass rate ≥ low")
    high: float = Field(1.0, ge=0, le=1, description="keep prompts with pass rate ≤ high")
    drop_never_solved: bool = Field(True, description="drop prompts with c = 0 (no learning signal)")
    drop_always_solved: bool = Field(True, description="drop prompts with c = n (no learning signal)")

    @model_validator(mode="after")
    def _ks_fit(self) -> "PassKConfig":
        bad = [k for k in self.ks if k < 1 or k > self.n_samples]
        if bad:
            raise ValueError(f"ks {bad} must be between 1 and n_samples={self.n_samples}")
        if self.low > self.high:
            raise ValueError(f"low={self.low} is above high={self.high}")
        return self


class CurriculumConfig(Strict):
    strategy: str = Field("easy_to_hard", description="ordering of the kept prompts (rlvr_core.data.curriculum registry)")
    seed: int = Field(0, description="seed for 'random' and bucket shuffles")
    id_tolerance: float = Field(0, ge=0, description="unmatched ids tolerated between pass-rate table and data "
                                "(count, or fraction if < 1); 0 = every id must match (G-id-mismatch)")

    @field_validator("strategy")
    @classmethod
    def _known(cls, v: str) -> str:
        return one_of(v, known_orderings(), "strategy")


def _known_verifier(name: str) -> str:
    try:
        verifier_class(name)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    return name


def _resolve_workers(data: Any, verifier_key: str, workers_key: str) -> Any:
    """Fill an unset worker count with the verifier's default (0 = in-process for verifiers that cannot
    hang, else 2), so the resolved config stores the number that ran."""
    if isinstance(data, dict) and data.get(workers_key) is None:
        name = data.get(verifier_key, "gsm8k")
        try:
            data = {**data, workers_key: default_workers(name)}
        except (KeyError, TypeError):
            pass  # the verifier field's own check names the problem
    return data


def _refuse_in_process_hang(name: str, workers: int, field: str) -> None:
    if workers == 0 and can_hang(name):
        raise ValueError(f"{field}=0 runs verifier {name!r} in-process, where nothing can stop a hang; "
                         f"{name!r} can hang (math, minerva, ifeval, code can), so use {field} >= 1")


class _Scoring(Strict):
    """A section that names a `verifier` and a worker count (the field named by `_WORKERS`): the verifier must
    be known, an unset count becomes the verifier's default, and 0 is refused for a verifier that can hang."""

    _WORKERS: ClassVar[str]

    @model_validator(mode="before")
    @classmethod
    def _default_workers(cls, data: Any) -> Any:
        return _resolve_workers(data, "verifier", cls._WORKERS)

    @field_validator("verifier", check_fields=False)
    @classmethod
    def _verifier_known(cls, v: str) -> str:
        return _known_verifier(v)

    @model_validator(mode="after")
    def _hang_proof(self) -> "_Scoring":
        _refuse_in_process_hang(self.verifier, getattr(self, self._WORKERS), self._WORKERS)
        return self


class RewardConfig(_Scoring):
    """How training (GRPO rewards) and the pass-rate stage score completions; `eval:` has its own settings.

    Unset `verifier` (and then `mode`) come from `eval.verifier` / `eval.verifier_mode`, so a config that
    names one verifier uses it everywhere. What scores a completion is in the training folder's key (`InKey`); the
    flag shares only name the run (`NamesRun`); the worker count is out of it."""

    verifier: str = InKey("gsm8k", description="verifier name (see `rlvr verify`); unset = eval.verifier")
    mode: str | None = InKey(None, description="verifier mode (gsm8k: flexible|strict, math: lenient|boxed, "
                                               "ifeval: strict|loose); unset with verifier unset = eval.verifier_mode")
    workers: int | None = Field(None, ge=0, description="verifier worker processes per trainer rank; unset = the "
                                "verifier's default: 0 (in-process) for verifiers that cannot hang (gsm8k, mcq), else 2; "
                                "0 is refused for verifiers that can hang (math, minerva, ifeval, code)")
    timeout_s: float = InKey(5.0, gt=0, description="per-completion limit in the completion's own time (CPU time "
                             "plus time blocked, not time spent waiting for a busy CPU); past it: status timeout")
    timeout_reward: float = InKey(0.0, description="reward of a completion whose verification timed out")
    max_timeout_share: float = NamesRun(0.1, ge=0, le=1, description="G-verifier-hang: a training step where more "
                                        "than this share of completions timed out is flagged (health/G-verifier-hang)")
    max_error_share: float = NamesRun(0.05, ge=0, le=1, description="G-verifier-error: a training step where more "
                                      "than this share of completions got status error (the verifier raised; each "
                                      "scored 0) is flagged (health/G-verifier-error)")
    _WORKERS: ClassVar[str] = "workers"

    def pool_options(self) -> dict[str, Any]:
        """The verifier's options for `VerifierPool`."""
        return {"mode": self.mode} if self.mode else {}


class EvalConfig(_Scoring):
    max_problems: int | None = Field(None, ge=1, description="evaluate at most this many held-out problems (None = all)")
    n_samples: int = Field(32, ge=1, description="sampled completions per problem for pass@k, k up to n (plus one greedy)")
    temperature: float = Field(1.0, ge=0, description="temperature of the sampled completions")
    max_new_tokens: int = Field(48, ge=1, description="completion length cap of the evaluation; too short a cap "
                                "cuts answers off and lowers every score (G-truncation: the truncation share is reported)")
    verifier: str = Field("gsm8k", description="verifier name (see `rlvr verify`)")
    verifier_mode: str | None = Field(None, description="verifier mode, e.g. strict or flexible")
    verifier_workers: int | None = Field(None, ge=0, description="verifier worker processes; unset = the verifier's "
                                         "default (see reward.workers); 0 = in-process, refused for verifiers that can hang")
    verifier_timeout_s: float = Field(5.0, gt=0, description="per-verification limit in the item's own time; overruns "
                                      "are killed and counted (G-verifier-hang)")
    max_verifier_error_share: float = Field(0.05, ge=0, le=1, description="G-verifier-error: an evaluation (any "
                                            "scoring) whose share of completions the verifier failed on (status "
                                            "error) exceeds this is flagged in its summary, the run's health_events "
                                            "and the report; the numbers are kept as they are")
    max_truncation_share: float = Field(0.1, ge=0, le=1, description="G-truncation: an evaluation whose share of "
                                        "completions cut off at max_new_tokens exceeds this is flagged (the "
                                        "reported case: 13 % truncated, scores 3-5 points low); raise "
                                        "eval.max_new_tokens rather than this")
    _WORKERS: ClassVar[str] = "verifier_workers"


class TracesConfig(Strict):
    """Which rollouts and evaluation samples reach MLflow as traces (docs/tracking.md, "Rollout traces")."""
    enabled: bool = Field(True, description="log rollout traces to the run (nothing is logged without an MLflow run)")
    groups_per_step: int = Field(4, ge=0, description="trained groups (all their completions) traced on a traced step; "
                                 "the first ones in sampling order")
    every: int | Literal["eval"] = Field("eval", description="which steps are traced: 'eval' = the steps the periodic "
                                         "evaluation runs at (grpo.eval_every, and the last step); N = every N steps "
                                         "and the last; 0 = only steps a guard flagged")
    flagged: bool = Field(True, description="every group of a step where a guard flagged (health/* set) is traced")
    flagged_cooldown: int = Field(20, ge=0, description="after a guard's flagged step is traced, that guard's flags "
                                  "in the next N steps are not traced again (a guard that flags on many steps in a "
                                  "row would trace every group of each); 0 = every flagged step")
    eval_wrong: int = Field(8, ge=0, description="wrong greedy completions of each periodic evaluation traced (the "
                            "first ones in problem order); 0 = none")
    max_chars: int = Field(20000, ge=100, description="prompts and completions longer than this are cut in the trace "
                           "(the warehouse keeps them whole)")

    @field_validator("every")
    @classmethod
    def _every_count(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0:
            raise ValueError(f"must be 'eval' or an integer >= 0, got {v}")
        return v


class TrackingConfig(Strict):
    experiment: str = Field("rlvr-demo", min_length=1, description="MLflow experiment name")
    tracking_uri: str | None = Field(None, description="MLflow URI; None = MLFLOW_TRACKING_URI or the embedded sqlite store")
    traces: TracesConfig = Field(default_factory=TracesConfig, description="rollouts as MLflow traces")


class StorageConfig(Strict):
    artifact_uri: str | None = Field(None, description="artifact root (dir or s3://bucket/prefix); None = RLVR_ARTIFACT_URI or $RLVR_HOME/artifacts")
    s3_endpoint_url: str | None = Field(None, description="S3 endpoint override (MinIO, moto); None = RLVR_S3_ENDPOINT_URL/AWS_ENDPOINT_URL")


class ExperimentConfig(AddedLater):
    _ADDED_LATER: ClassVar[tuple[str, ...]] = ("environment",)

    name: str = Field("demo", min_length=1, description="experiment name; part of artifact paths")
    seed: int = Field(0, description="top-level seed recorded in the manifest")
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    prompt: PromptConfig = Field(default_factory=PromptConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    passk: PassKConfig = Field(default_factory=PassKConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig, description="training and pass-rate scoring")
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig, description="what the policy talks "
                                           "to over its turns; single_turn (the default) is one completion")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)

    @model_validator(mode="after")
    def _template_fits_model(self) -> "ExperimentConfig":
        """G-chat-template: a chat template on a base model (or a raw one on a chat model) is refused here,
        before any work, unless `prompt.allow_kind_mismatch` says it is deliberate."""
        kind = get_template(self.prompt.template).kind
        why = None
        if kind != self.model.kind and not self.prompt.allow_kind_mismatch:
            why = (f"template {self.prompt.template!r} is for {kind} models but model.kind is {self.model.kind!r} "
                   f"(G-chat-template): use a {self.model.kind} template, or set prompt.allow_kind_mismatch: true "
                   "if this is deliberate")
        elif kind == "chat" and self.model.kind == "base":
            # The opt-out covers a raw prompt on a chat model (zero-RL recipes). A chat template is rendered through
            # the model's own chat template, which a base model's tokenizer does not have: nothing could render it.
            why = (f"template {self.prompt.template!r} is a chat template and model.kind is 'base' (G-chat-template): "
                   "a base model's tokenizer has no chat template to render it, so prompt.allow_kind_mismatch "
                   "cannot allow it (it allows a base template on a chat model); use a base template such as 'qa'")
        if why:
            raise ValidationError.from_exception_data("ExperimentConfig", [InitErrorDetails(
                type=PydanticCustomError("value_error", why), loc=("prompt", "template"), input=self.prompt.template)])
        return self

    @model_validator(mode="after")
    def _environment_fits(self) -> "ExperimentConfig":
        """A multi-turn environment runs on-policy with fixed-size groups (every engine takes token ids)."""
        env, why, loc = self.environment, None, ("environment", "name")
        if not env.multi_turn:
            return self
        if self.grpo.max_staleness or self.grpo.adaptive_sampling:
            why = (f"environment {env.name!r} runs on-policy with fixed groups: set grpo.max_staleness: 0 and "
                   "grpo.adaptive_sampling: false")
        if why:
            raise ValidationError.from_exception_data("ExperimentConfig", [InitErrorDetails(
                type=PydanticCustomError("value_error", why), loc=loc, input=env.name)])
        return self

    @model_validator(mode="before")
    @classmethod
    def _reward_follows_eval(cls, data: Any) -> Any:
        """An unset reward verifier is the eval verifier (and its mode, when the verifier is the same)."""
        if not isinstance(data, dict):
            return data
        ev = data.get("eval") if isinstance(data.get("eval"), dict) else {}
        reward = data.get("reward") if isinstance(data.get("reward"), dict) else ({} if data.get("reward") is None else None)
        if reward is None:  # not a mapping: the field's own check names it
            return data
        reward = dict(reward)
        same = reward.get("verifier") in (None, ev.get("verifier", "gsm8k"))
        reward.setdefault("verifier", ev.get("verifier", "gsm8k"))
        if same and reward.get("mode") is None:
            reward["mode"] = ev.get("verifier_mode")
        return {**data, "reward": reward}

    def resolved(self) -> dict[str, Any]:
        """Every field with defaults filled in, JSON-safe: what a run stores and hashes."""
        return self.model_dump(mode="json")

    def config_hash(self) -> str:
        return config_hash(self.resolved())


def config_hash(resolved: dict[str, Any]) -> str:
    """sha256 of the canonical JSON (sorted keys, no whitespace): stable across key order and runs."""
    canonical = json.dumps(resolved, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _field_path(loc: tuple[Any, ...]) -> str:
    """Dotted, without the tag a discriminated union puts in (`sampling.push.file.folder` is `sampling.push.folder`)."""
    return ".".join(str(p) for i, p in enumerate(loc) if not (i and loc[i - 1] == "push" and p in PUSH_TYPES))


def _why(err: dict[str, Any]) -> str:
    if err["type"] == "extra_forbidden":
        return "unknown key"
    msg = err["msg"]
    if err["type"] not in ("value_error", "assertion_error") and "input" in err and not isinstance(err["input"], dict):
        msg += f" (got {err['input']!r})"
    return msg.removeprefix("Value error, ")


def parse_config(data: Any, source: str = "<config>") -> ExperimentConfig:
    """Validate a mapping into an ExperimentConfig, or raise ConfigError naming `source` and each field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, [("", f"top level must be a mapping, got {type(data).__name__}")])
    try:
        return ExperimentConfig.model_validate(data, context={"source": source})
    except ValidationError as e:
        raise ConfigError(source, [(_field_path(err["loc"]), _why(err)) for err in e.errors()]) from None


def read_yaml_file(path: str | Path) -> Any:
    """The parsed YAML of `path`; a missing file or bad YAML is a ConfigError naming the file (and line)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(str(p), [("", "no such file")])
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(str(p), [("", f"{where}not valid YAML ({getattr(e, 'problem', e)})")]) from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Read a YAML experiment file; `overrides` are dotted keys (`grpo.lr: 1e-5`) applied on top."""
    p = Path(path)
    data = read_yaml_file(p)
    if overrides:
        if data is not None and not isinstance(data, dict):
            raise ConfigError(str(p), [("", f"top level must be a mapping, got {type(data).__name__}")])
        data = apply_overrides(data or {}, overrides)
    try:
        return parse_config(data, str(p))
    except ConfigError as e:
        raise _blame_overrides(e, str(p), overrides or {}) from None


def _blame_overrides(err: ConfigError, source: str, overrides: dict[str, Any]) -> ConfigError:
    """Problems at (or under) an overridden key are the override's (`--set grpo.lrr=1`), not the file's."""
    def key_of(field: str) -> str | None:
        return next((k for k in overrides if field == k or field.startswith(k + ".")), None)

    ours = [(f, why) for f, why in err.problems if key_of(f)]
    if not ours:
        return err
    keys = sorted({key_of(f) for f, _ in ours})
    what = (f"override {keys[0]}={overrides[keys[0]]!r}" if len(keys) == 1 else "overrides " + ", ".join(keys))
    out = ConfigError(f"{what} (applied to {source})", ours)
    theirs = [(f, why) for f, why in err.problems if not key_of(f)]
    if theirs:  # the file's own problems follow, still named by the file
        out.problems = err.problems
        out.args = (str(out) + "".join(f"\n  {source}: {f}: {why}" if f else f"\n  {source}: {why}"
                                       for f, why in theirs),)
    return out


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of `data` with dotted-key overrides set (`{"grpo.lr": 1e-5}`)."""
    out = json.loads(json.dumps(data))
    for dotted, value in overrides.items():
        dotted = moved_override(dotted, value)
        node = out
        *parents, leaf = dotted.split(".")
        for key in parents:
            if node.get(key) is None:  # absent, or an optional section left null (sampling.server_launch)
                node[key] = {}
            node = node[key]
            if not isinstance(node, dict):
                raise ConfigError("<overrides>", [(dotted, f"{key!r} is not a mapping")])
        node[leaf] = value
    return out


def moved_override(dotted: str, value: Any = None, source: str = "<overrides>") -> str:
    """A `--set` / sweep key by its current path: `sampling.server_push_backend` -> `sampling.push.type`,
    `grpo.micro_batch_size` -> `grpo.memory.micro_batch_size` (with the ConfigDeprecation line); any other
    key as it is."""
    new = moved_push_key(dotted)
    if new is None:
        return moved_grpo_key(dotted, value, source)
    say_moved(dotted, new, source)
    return new


def check_files(cfg: ExperimentConfig, source: str = "<config>") -> None:
    """Fail before any work when a file the config names is missing (paths are relative to the cwd)."""
    problems: list[tuple[str, str]] = []
    if cfg.data.source != "synthetic":
        for name in ("train_path", "test_path"):
            value = getattr(cfg.data, name)
            if value and not Path(value).exists():
                problems.append((f"data.{name}", f"no such file: {value}"))
    ref = cfg.model.hub_ref()
    if ref is not None:
        problems += _hub_model_problems(*ref)
    elif cfg.model.source == "hf" and not (Path(cfg.model.path) / "config.json").is_file():
        problems.append(("model.path", f"not a local model directory (no config.json) nor a hub id (org/name): "
                         f"{cfg.model.path}"))
    if problems:
        raise ConfigError(source, problems)


def _hub_model_problems(repo: str, revision: str | None) -> list[tuple[str, str]]:
    """Offline, a hub model must already be in the cache: say so now, not after the data stage."""
    if not hub.offline():
        return []  # fetched (cache first) by the model stage
    try:
        hub.snapshot(repo, revision=revision, hash_files=False)
    except hub.HubMissing as e:
        return [("model.path", str(e))]
    return []


# What `rlvr demo` changes from the defaults: it trains, and its base model learned from a hasty teacher.
# The base is warm-started for 300 supervised steps on demonstrations of which 70 % stop one step early
# ("#### <total so far>"): it has the arithmetic (pass@8 ≈ 0.45) but greedily answers too soon (≈ 0.03),
# the kind of habit RL with a verifier undoes. GRPO: 120 steps of 16 prompts × 8 rollouts at T 1.0, lr 3e-4
# with a KL anchor (beta 0.1), DAPO dynamic sampling, prompts in random order. Over 3 training seeds × 2 data
# seeds × 1 and 2 threads the paired greedy gain is large everywhere (docs/demo.md, "Robustness"); how the
# recipe was found, failures included: docs/grpo_tuning.md, session 7.
# `configs/demo.yaml` spells the same experiment out (a test checks).
DEMO_SETTINGS: dict[str, Any] = {
    "model": {"warm_start": {"steps": 300, "teacher_stops_early": 0.7}},
    "passk": {"max_prompts": None, "drop_never_solved": False},
    "curriculum": {"strategy": "random"},
    "grpo": {"enabled": True, "steps": 120, "temperature": 1.0, "lr": 3.0e-4, "beta": 0.1, "warmup_steps": 10,
             "dynamic_sampling": True, "dynamic_sampling_max_rounds": 3, "eval_every": 40},
}


def demo_config() -> ExperimentConfig:
    """The `rlvr demo` experiment: the defaults plus DEMO_SETTINGS. `configs/demo.yaml` spells it out."""
    return parse_config(copy.deepcopy(DEMO_SETTINGS), "<demo defaults>")


def dump_yaml(cfg: ExperimentConfig) -> str:
    return yaml.safe_dump(cfg.resolved(), sort_keys=False)
