"""Sealing a config's secrets (rlvr_core.experiment.secrets): what crosses a process or Prefect boundary holds
placeholders; the receiver resolves them from its environment, or fails naming the field and the variable."""

from __future__ import annotations

import pytest

from rlvr_core.experiment.config import demo_config
from rlvr_core.experiment.secrets import SecretUnavailable, is_sealed, seal, unseal

URI = "http://rlvr:hunter2@mlflow.example:5000"


def test_seal_replaces_exactly_the_secrets_and_unseal_restores_them():
    cfg = demo_config().resolved()
    cfg["tracking"]["tracking_uri"] = URI
    params = {"config": cfg, "overrides": {"storage.api_key": "AKIA-1", "eval.max_new_tokens": 48,
                                           "grpo.lr": 1e-5, "note": ["http://a:pw2@h/x", "plain"]}}
    sealed = {k: seal(v, k)[0] for k, v in params.items()}
    found = {name: value for k, v in params.items() for name, value in seal(v, k)[1].items()}
    assert found == {"RLVR_SECRET_CONFIG_TRACKING_TRACKING_URI": URI, "RLVR_SECRET_OVERRIDES_STORAGE_API_KEY": "AKIA-1",
                     "RLVR_SECRET_OVERRIDES_NOTE_0": "http://a:pw2@h/x"}
    assert sealed["config"]["tracking"]["tracking_uri"] == "${secret:RLVR_SECRET_CONFIG_TRACKING_TRACKING_URI}"
    assert "hunter2" not in repr(sealed) and "AKIA-1" not in repr(sealed) and "pw2" not in repr(sealed)
    # Everything else is untouched: counts of tokens, numbers, plain strings, the rest of the config.
    assert sealed["overrides"]["eval.max_new_tokens"] == 48 and sealed["overrides"]["note"][1] == "plain"
    assert {k: v for k, v in sealed["config"].items() if k != "tracking"} == {
        k: v for k, v in cfg.items() if k != "tracking"}
    assert is_sealed(sealed) and not is_sealed(params)
    assert {k: unseal(v, "test", found) for k, v in sealed.items()} == params


def test_a_missing_variable_names_the_source_the_field_and_the_variable():
    sealed, _ = seal({"tracking": {"tracking_uri": URI}}, "config")
    with pytest.raises(SecretUnavailable) as e:
        unseal(sealed, "<flow run 1234>", environ={}, path="config")
    msg = str(e.value)
    assert "<flow run 1234>" in msg and "'config.tracking.tracking_uri'" in msg
    assert "RLVR_SECRET_CONFIG_TRACKING_TRACKING_URI" in msg and "hunter2" not in msg
