"""Ablation sweeps as files: `configs/sweeps/<name>.yaml` in, a validated list of trial configs out.

A sweep is a base experiment plus what varies:

    name: demo-lr                    # the sweep's name (also the deployment name used in the docs)
    description: …
    base: ../demo.yaml                # an experiment file (relative to this file) or an inline mapping
    set: {grpo.enabled: true, …}      # dotted overrides applied to the base for every trial
    grid:                             # every combination of these values …
      grpo.loss_agg: [token-mean, seq-mean-token-mean]
      grpo.lr: [1.0e-5, 5.0e-5]
    variants:                         # … crossed with each of these override sets (optional)
      - {grpo.beta: 0.0}
      - {grpo.beta: 0.02}
    seeds: [0, 1]                     # … crossed with each seed
    seed_keys: [seed]                 # the config fields a trial's seed is written to
    metric: accuracy_greedy           # the headline number the sweep's pivot reports

Trials = product(grid) × variants × seeds, in that nesting order, each a full `ExperimentConfig`
validated before any work starts; a bad sweep fails with a `ConfigError` naming the file and the field
(`grid.grpo.lr[1]`, `variants[0].grpo.bogus`, …). No Prefect here: the flow in `flows/ablation_sweep.py`
only runs what this module expands.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rlvr_core.experiment.config import (ConfigError, ExperimentConfig, apply_overrides, check_files, config_hash,
                                         moved_override, parse_config, read_yaml_file)
from rlvr_core.pipeline.stages import held_out_spec
from rlvr_core.records import warehouse_queries
from rlvr_core.records.tracking import metric_key

SWEEP_METRICS = ("accuracy_greedy", "pass@1", "pass@2", "pass@4", "pass@8")


class SweepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
                      description="sweep name: letters, digits, '-', '_', '.'")
    description: str = ""
    base: str | dict[str, Any] = Field(description="experiment file (relative to the sweep file) or inline mapping")
    set: dict[str, Any] = Field(default_factory=dict, description="dotted overrides applied to every trial")
    grid: dict[str, list[Any]] = Field(default_factory=dict, description="dotted key → values; all combinations")
    variants: list[dict[str, Any]] = Field(default_factory=list, description="override sets crossed with the grid")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, description="one trial per seed per cell")
    seed_keys: list[str] = Field(default_factory=lambda: ["seed"], min_length=1,
                                 description="config fields a trial's seed is written to")
    metric: str = Field("accuracy_greedy", description="headline metric of the pivot")

    @field_validator("grid")
    @classmethod
    def _non_empty_values(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            if not values:
                raise ValueError(f"{key}: needs at least one value")
            if len({json.dumps(x, sort_keys=True) for x in values}) != len(values):
                raise ValueError(f"{key}: repeated values {values}")
        return v

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"repeated seeds {v}")
        return v

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, v: str) -> str:
        if v not in SWEEP_METRICS:
            raise ValueError(f"unknown metric {v!r}; known: {', '.join(SWEEP_METRICS)}")
        return v


@dataclass(frozen=True)
class Trial:
    trial_id: str                 # stable within the sweep: "t03"
    label: str                    # what differs, short keys: "loss_agg=token-mean lr=1e-05 seed=0" (MLflow run name)
    overrides: dict[str, Any]     # the dotted overrides that make this trial (grid + variant + seed)
    cell: dict[str, Any]          # the same without the seed: trials of one cell differ only by seed
    seed: int
    config: dict[str, Any]        # resolved ExperimentConfig (JSON-safe), validated


@dataclass(frozen=True)
class Sweep:
    spec: SweepSpec
    source: str
    base_config: dict[str, Any]   # resolved base with `set` applied
    trials: list[Trial]

    @property
    def swept_keys(self) -> list[str]:
        """Dotted keys that differ between cells (the pivot's columns), in file order."""
        keys = list(self.spec.grid)
        for v in self.spec.variants:
            keys += [k for k in v if k not in keys]
        return keys

    @property
    def sweep_hash(self) -> str:
        return config_hash({"spec": self.spec.model_dump(mode="json"), "base": self.base_config})[:16]


def _format(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def parse_sweep(data: Any, source: str = "<sweep>", base_dir: Path | None = None) -> Sweep:
    """Validate a sweep mapping and expand it into trials, or raise ConfigError naming `source` and the field."""
    if not isinstance(data, dict):
        raise ConfigError(source, [("", f"top level must be a mapping, got {type(data).__name__}")])
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            why = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
            problems.append((_field_path(err["loc"]), why))
        raise ConfigError(source, problems) from None

    # The base: a file next to the sweep, or inline.
    if isinstance(spec.base, str):
        base_path = Path(spec.base)
        if not base_path.is_absolute():
            base_path = (base_dir or Path.cwd()) / base_path
        if not base_path.is_file():
            raise ConfigError(source, [("base", f"no such experiment file: {base_path}")])
        try:
            base_data = yaml.safe_load(base_path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(source, [("base", f"{base_path} is not valid YAML ({e})")]) from None
        base_src = str(base_path)
    else:
        base_data, base_src = spec.base, f"{source} (base)"
    if not isinstance(base_data, dict):
        raise ConfigError(source, [("base", f"must be a mapping, got {type(base_data).__name__}")])
    base_cfg = _validated(apply_overrides(base_data, spec.set), source, "set", base_src)

    known = _known_leaves(base_cfg.resolved())
    problems: list[tuple[str, str]] = []
    for where, keys in (("set", spec.set), ("grid", spec.grid),
                        *((f"variants[{i}]", v) for i, v in enumerate(spec.variants)),
                        ("seed_keys", {k: None for k in spec.seed_keys})):
        for key in keys:
            if moved_override(key, keys[key], source) not in known:  # a moved key (grpo.micro_batch_size) works
                problems.append((f"{where}.{key}" if where != "seed_keys" else f"seed_keys: {key}",
                                 "not a field of the experiment config"))
    if problems:
        raise ConfigError(source, problems)

    grid_keys = list(spec.grid)
    short = short_names([*grid_keys, *(k for v in spec.variants for k in v)])
    cells = [dict(zip(grid_keys, combo)) for combo in itertools.product(*(spec.grid[k] for k in grid_keys))]
    cells = [{**c, **v} for c in cells for v in (spec.variants or [{}])]
    labels_seen: set[str] = set()
    trials: list[Trial] = []
    for ci, cell in enumerate(cells):
        key = json.dumps(cell, sort_keys=True)
        if key in labels_seen:
            raise ConfigError(source, [("variants", f"two cells are identical: {cell}")])
        labels_seen.add(key)
        for seed in spec.seeds:
            overrides = {**cell, **{k: seed for k in spec.seed_keys}}
            i = len(trials)
            where = _where(spec, cell)
            cfg = _validated(apply_overrides(base_cfg.resolved(), overrides), source, where, base_src)
            _check_schedule(cfg, source, _origin(spec, cell, where, ("grpo.warmup_steps", "grpo.steps")))
            label = " ".join(f"{short[k]}={_format(v)}" for k, v in cell.items()) + f" seed={seed}"
            trials.append(Trial(f"t{i:02d}", label.strip(), overrides, cell, seed, cfg.resolved()))
    return Sweep(spec, source, base_cfg.resolved(), trials)


def short_names(keys: list[str]) -> dict[str, str]:
    """Dotted keys → the shortest unique dotted suffixes: `grpo.lr` → `lr`, but `grpo.lr` and
    `model.warm_start.lr` → `grpo.lr` and `warm_start.lr` (run names must say what differs, and fit)."""
    keys = list(dict.fromkeys(keys))
    depth = {k: 1 for k in keys}
    while True:
        names = {k: ".".join(k.split(".")[-depth[k]:]) for k in keys}
        clash = [k for k in keys if list(names.values()).count(names[k]) > 1 and depth[k] < len(k.split("."))]
        if not clash:
            return names
        for k in clash:
            depth[k] += 1


def _check_schedule(cfg: ExperimentConfig, source: str, where: str) -> None:
    """A trial whose warm-up lasts as long as its training never reaches its peak lr: comparing lrs would compare
    nothing. (The lr climbs over `warmup_steps` updates, then decays: DeepSpeed's scheduler as
    `rlvr_core.grpo.policy.ds_config` sets it.)"""
    g = cfg.grpo
    if g.enabled and g.warmup_steps >= g.steps:
        raise ConfigError(source, [(f"{where}: grpo.warmup_steps",
                                    f"{g.warmup_steps} warm-up steps with grpo.steps {g.steps}: the lr never reaches "
                                    f"grpo.lr ({g.lr:g}); set grpo.warmup_steps below grpo.steps")])


def _origin(spec: SweepSpec, cell: dict[str, Any], where: str, keys: tuple[str, ...]) -> str:
    """Which part of the sweep file set `keys`: the cell's grid/variant, `set`, or the base experiment."""
    if any(k in cell for k in keys):
        return where
    return "set" if any(k in spec.set for k in keys) else "base"


def _where(spec: SweepSpec, cell: dict[str, Any]) -> str:
    for i, v in enumerate(spec.variants):
        if v and all(cell.get(k) == x for k, x in v.items()):
            return f"variants[{i}]"
    return "grid"


def _validated(data: dict[str, Any], source: str, where: str, base_src: str) -> ExperimentConfig:
    """Validate one expanded config; a failure names the sweep file, the part of it that caused it and the field."""
    try:
        return parse_config(data, base_src)
    except ConfigError as e:
        raise ConfigError(source, [(f"{where}: {path}" if path else where, why) for path, why in e.problems]) from None


def _known_leaves(resolved: dict[str, Any]) -> set[str]:
    """Every dotted key a trial may set: leaves of the resolved config, plus mapping nodes (e.g. `grpo`)."""
    out: set[str] = set()

    def walk(d: dict[str, Any], prefix: str) -> None:
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else k
            out.add(key)
            if isinstance(v, dict):
                walk(v, key)

    walk(resolved, "")
    # Optional fields that default to None (e.g. model.path) are leaves too; they are in `resolved` as None.
    # Fields left out of the resolved config at their default (added after configs were keyed: grpo.policy_loss,
    # grpo.distill_teacher, ...) are fields all the same: every field of the config models is one.
    out |= _model_leaves(ExperimentConfig, "")
    return out


def _model_leaves(model: type[BaseModel], prefix: str) -> set[str]:
    """Every dotted field path of a config model and its nested models."""
    out: set[str] = set()
    for name, f in model.model_fields.items():
        key = f"{prefix}.{name}" if prefix else name
        out.add(key)
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
            out |= _model_leaves(f.annotation, key)
    return out


def load_sweep(path: str | Path) -> Sweep:
    """Read and expand a sweep file; errors name the file and the field."""
    p = Path(path)
    return parse_sweep(read_yaml_file(p), str(p), p.parent)


def find_sweep(name_or_path: str, root: Path | None = None) -> Path:
    """A sweep by file path, or by name under `configs/sweeps/` (`demo-lr` → `demo_lr.yaml`)."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        return p
    folder = root or Path(__file__).resolve().parents[2] / "configs" / "sweeps"
    for cand in (folder / f"{name_or_path}.yaml", folder / f"{name_or_path.replace('-', '_')}.yaml"):
        if cand.is_file():
            return cand
    # Named as the docs and commands name them (`demo-lr`), not by their files (`demo_lr`).
    known = sorted(f.stem.replace("_", "-") for f in folder.glob("*.yaml"))
    raise ConfigError(name_or_path, [("", f"no sweep file of that name in {folder}; known: {', '.join(known)}")])


# ------------------------------------------------------------------------------------------ sweep files
def is_sweep_file(data: Any) -> bool:
    """A sweep file has a `base`; an experiment file never does (ExperimentConfig forbids the key)."""
    return isinstance(data, dict) and "base" in data


def check_sweep_files(sw: Sweep) -> None:
    """The files every trial names (data, local models) exist here; a ConfigError names the sweep and field."""
    for t in sw.trials:
        check_files(parse_config(t.config, sw.source), f"{sw.source}: trial {t.trial_id} ({t.label})")


def with_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`rlvr sweep run --set`: a sweep field (`seeds`, `metric`, …), a grid entry (`grid.grpo.lr`), or else a
    dotted experiment key added to the sweep's `set` (applied to every trial)."""
    out = {**data, "set": dict(data.get("set") or {}), "grid": dict(data.get("grid") or {})}
    for key, value in overrides.items():
        if key in SweepSpec.model_fields and key not in ("set", "grid"):
            out[key] = value
        elif key.startswith("grid."):
            out["grid"][key.removeprefix("grid.")] = value
        else:
            out["set"][key] = value
    return out


def submitted_mapping(path: Path, overrides: dict[str, Any] | None = None) -> tuple[Sweep, dict[str, Any]]:
    """Validate the sweep file (plus overrides) here, then return it with its base inlined: the mapping a
    remote sweep flow can expand without this machine's files."""
    raw = read_yaml_file(path)
    if not isinstance(raw, dict):
        raise ConfigError(str(path), [("", f"top level must be a mapping, got {type(raw).__name__}")])
    data = with_overrides(raw, overrides or {})
    source = str(path) + (" (with --set)" if overrides else "")
    sw = parse_sweep(data, source, path.parent)
    check_sweep_files(sw)
    if isinstance(data.get("base"), str):
        base = Path(data["base"])
        data["base"] = yaml.safe_load(((path.parent / base) if not base.is_absolute() else base).read_text()) or {}
    return sw, data


# ------------------------------------------------------------------------------------------ errors in one line
_WRAPPERS = ("Flow run encountered an exception: ", "Task run encountered an exception: ",
             "SweepFailed: ", "DeterministicError: ", "TransientError: ", "FlowRunCrashed: ")


def one_line_error(message: str | None) -> str:
    """The final exception of a (Prefect state) message in one line: a ConfigError's problems (each naming
    the file and field) joined by '; ', the last line of a traceback, or the message's lines joined."""
    text = (message or "").strip()
    while any(text.startswith(w) for w in _WRAPPERS):
        text = next(text.removeprefix(w) for w in _WRAPPERS if text.startswith(w)).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    if any(ln.startswith("Traceback (most recent call last):") for ln in lines):
        return lines[-1]  # a message that carries a (child process's) traceback: its last line is the final error
    if lines[0].endswith("invalid config") and len(lines) > 1:  # ConfigError: the problems are the message
        return "; ".join(lines[1:])
    return " ".join(lines)


# ------------------------------------------------------------------------------------------ pivot (warehouse)
# The canned query's columns a sweep pivot row keeps, after the swept values.
_PIVOT_COLUMNS = ("benchmark", "n_seeds", "mean", "sd", "ci_low", "ci_high", "ci_kind", "per_seed", "seeds",
                  "trial_ids", "n_problems")


def pivot_metric_key(sw: Sweep) -> str:
    """The MLflow metric on each trial run that the pivot averages: the trained checkpoint's evaluation
    (`eval/<benchmark>/trained/<metric>`), or the base model's (`eval/<benchmark>/<metric>`) in a sweep that
    does not train (the pipeline run's headline metrics, `rlvr_core.pipeline.run_record`, hold both shapes)."""
    cfg = parse_config(sw.trials[0].config, sw.source)
    return metric_key("eval", held_out_spec(cfg).name, *(("trained",) if cfg.grpo.enabled else ()), sw.spec.metric)


def sweep_pivot(sweep_id: str, swept_keys: list[str], metric: str = "accuracy_greedy",
                path: str | Path | None = None) -> list[dict[str, Any]]:
    """One row per cell of the sweep (and benchmark): the swept values, then the mean of `metric` over the
    cell's seeds and its 95% interval: Student t across seeds, or, for a cell with one seed, that trial's own
    Wilson interval (`ci_kind` says which). The numbers come from the canned query
    dashboards/queries/ablation_pivot.sql, the one the dashboard shows and the tests check; rows are ordered
    by their swept values."""
    rows = warehouse_queries.records("ablation_pivot", {"sweep": sweep_id, "metric": metric, "keys": swept_keys},
                                     path)
    pivot = []
    for r in rows:
        cell = json.loads(r["cell"])
        pivot.append({**{k: _at_default(k, cell.get(k)) for k in swept_keys}, **{f: r[f] for f in _PIVOT_COLUMNS}})
    return sorted(pivot, key=lambda r: [*(str(r[k]) for k in swept_keys), r["benchmark"]])


def _at_default(key: str, value: Any) -> Any:
    """A swept value as the pivot shows it: a field the resolved config leaves out at its default (the query's
    '∅', e.g. grpo.policy_loss ppo_clip) is that default, as the warehouse stores params: text."""
    if value != "∅":
        return value
    model: Any = ExperimentConfig
    *path, last = key.split(".")
    for name in path:
        f = model.model_fields.get(name) if isinstance(model, type) and issubclass(model, BaseModel) else None
        model = f.annotation if f is not None else None
    f = model.model_fields.get(last) if isinstance(model, type) and issubclass(model, BaseModel) else None
    if f is None or f.is_required():
        return value
    default = f.get_default(call_default_factory=True)
    return value if isinstance(default, BaseModel) else str(default)


def pivot_rows(pivot: list[dict[str, Any]], swept_keys: list[str]) -> list[dict[str, Any]]:
    """The pivot as JSON-safe rows (the Prefect table artifact, `rlvr sweep` output). Numbers stay unrounded, so
    the CLI's 3-digit print of an artifact equals that of the warehouse pivot."""
    def num(v: Any) -> Any:
        return None if v is None else float(v)

    return [{**{k: r[k] for k in swept_keys}, "n_seeds": r["n_seeds"], "mean": num(r["mean"]),
             "ci_low": num(r["ci_low"]), "ci_high": num(r["ci_high"]), "ci": r["ci_kind"],
             "per_seed": ", ".join(f"{v:.3f}" for v in r["per_seed"]),
             "seeds": ", ".join(str(s) for s in r["seeds"]), "trials": ", ".join(r["trial_ids"])} for r in pivot]


def format_pivot(rows: list[dict[str, Any]], swept_keys: list[str], metric: str) -> str:
    """A plain-text table: one line per cell with its swept values, seeds, mean, 95% CI and per-seed values."""
    short = short_names(swept_keys)
    cols = [short[k] for k in swept_keys] + ["seeds", f"mean {metric}", "95% CI", "per seed"]
    cells = [[_format(r.get(k)) for k in swept_keys]
             + [str(r["n_seeds"]), f"{r['mean']:.3f}",
                "—" if r["ci_low"] is None else f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]",
                f"{r['per_seed']}  (seeds {r['seeds']})"] for r in rows]
    widths = [max([len(c)] + [len(x[i]) for x in cells]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip(), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(x, widths)).rstrip() for x in cells]
    kinds = sorted({r["ci"] for r in rows})
    lines.append(f"95% CI: {'; '.join(kinds)} (Student t across seeds; Wilson over problems when a cell has 1 seed)"
                 if kinds else "(no finished trials yet)")
    return "\n".join(lines)


def swept_keys_from_params(trials: dict[str, dict[str, str]]) -> list[str]:
    """The swept keys of a finished sweep, from its trials' warehouse params alone, in the labels' order: each
    name a trial label gives (`lr=` in "lr=1e-05 seed=0"; the last part is the seed) is the config field it is
    a dotted suffix of, the one whose value differs between trials when several match. Without labels: the
    differing fields that are not equal to the trial's seed."""
    keys = sorted({k for p in trials.values() for k in p if not k.startswith("sweep.")})
    differ = {k for k in keys if len({p.get(k) for p in trials.values()}) > 1}
    names: list[str] = []
    for p in trials.values():
        for tok in (p.get("sweep.trial_label") or "").split(" ")[:-1]:
            if "=" in tok and tok.split("=", 1)[0] not in names:
                names.append(tok.split("=", 1)[0])
    if not names:
        return [k for k in sorted(differ) if not all(p.get(k) == p.get("seed") for p in trials.values())]
    out: list[str] = []
    for name in names:
        cands = [k for k in keys if k == name or k.endswith("." + name)]
        varying = [k for k in cands if k in differ]
        pick = varying if len(varying) == 1 else cands if len(cands) == 1 else []
        out += [k for k in pick if k not in out]
    return out
