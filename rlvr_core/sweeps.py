"""Ablation sweeps as files: `configs/sweeps/<name>.yaml` in, a validated list of trial configs out.

A sweep is a base experiment plus what varies:

    name: demo-2x2                    # the sweep's name (also the deployment name used in the docs)
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

from rlvr_core.config import ConfigError, ExperimentConfig, apply_overrides, config_hash, parse_config, read_yaml_file

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
    label: str                    # what varies, readable: "grpo.loss_agg=token-mean grpo.lr=1e-05 seed=0"
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
            if key not in known:
                problems.append((f"{where}.{key}" if where != "seed_keys" else f"seed_keys: {key}",
                                 "not a field of the experiment config"))
    if problems:
        raise ConfigError(source, problems)

    grid_keys = list(spec.grid)
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
            label = " ".join(f"{k}={_format(v)}" for k, v in cell.items()) + f" seed={seed}"
            trials.append(Trial(f"t{i:02d}", label.strip(), overrides, cell, seed, cfg.resolved()))
    return Sweep(spec, source, base_cfg.resolved(), trials)


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
    return out


def load_sweep(path: str | Path) -> Sweep:
    """Read and expand a sweep file; errors name the file and the field."""
    p = Path(path)
    return parse_sweep(read_yaml_file(p), str(p), p.parent)


def find_sweep(name_or_path: str, root: Path | None = None) -> Path:
    """A sweep by file path, or by name under `configs/sweeps/` (`demo-2x2` → `demo_2x2.yaml`)."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        return p
    folder = root or Path(__file__).resolve().parent.parent / "configs" / "sweeps"
    for cand in (folder / f"{name_or_path}.yaml", folder / f"{name_or_path.replace('-', '_')}.yaml"):
        if cand.is_file():
            return cand
    known = sorted(f.stem for f in folder.glob("*.yaml"))
    raise ConfigError(name_or_path, [("", f"no sweep file of that name in {folder}; known: {', '.join(known)}")])
