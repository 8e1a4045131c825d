"""A typo in an override (`--set grpo.lrr=1`, a pipeline's `overrides`) is blamed on the override, not on the
config file it was applied to (before: `configs/demo.yaml: grpo.lrr: unknown key`); the file's own problems
are still named by the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr_core.experiment.config import ConfigError, load_config

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"


def test_an_override_typo_names_the_override():
    with pytest.raises(ConfigError) as e:
        load_config(DEMO, {"grpo.lrr": 1, "grpo.lr": 1e-5})
    assert str(e.value).splitlines()[1:] == [f"  override grpo.lrr=1 (applied to {DEMO}): grpo.lrr: unknown key"]
    with pytest.raises(ConfigError, match=r"override grpo.lr='fast' \(applied to .*demo.yaml\): grpo.lr: Input should"):
        load_config(DEMO, {"grpo.lr": "fast"})


def test_the_files_own_problems_stay_the_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(DEMO.read_text() + "\nnot_a_section: 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(bad, {"grpo.steps": -1})
    lines = str(e.value).splitlines()[1:]
    assert lines[0].startswith(f"  override grpo.steps=-1 (applied to {bad}): grpo.steps: ")
    assert lines[1] == f"  {bad}: not_a_section: unknown key"
    with pytest.raises(ConfigError, match=f"{bad}: not_a_section: unknown key"):
        load_config(bad)


def test_cli_and_pipeline_blame_the_override(tmp_path, monkeypatch):
    from flows.pipeline import resolve_config
    from rlvr_cli.main import app

    monkeypatch.setenv("RLVR_HOME", str(tmp_path))
    res = CliRunner().invoke(app, ["config", "show", str(DEMO), "--set", "grpo.lrr=1"])
    assert res.exit_code != 0 and f"override grpo.lrr=1 (applied to {DEMO}): grpo.lrr: unknown key" in res.output
    assert f"  {DEMO}: grpo.lrr" not in res.output
    with pytest.raises(ConfigError, match=r"override grpo.lrr=1 \(applied to .*configs/demo.yaml\)"):
        resolve_config("configs/demo.yaml", {"grpo.lrr": 1})


def test_an_override_fills_an_optional_section_left_null():
    from rlvr_core.experiment.config import apply_overrides, demo_config, parse_config

    data = demo_config().model_dump(mode="json")
    assert data["sampling"]["server_launch"] is None
    cfg = parse_config(apply_overrides(data, {"sampling.engine": "vllm-server", "sampling.server_launch.count": 2}))
    assert cfg.sampling.server_launch.count == 2
    with pytest.raises(ConfigError, match="'engine' is not a mapping"):
        apply_overrides(data, {"sampling.engine.x": 1})
