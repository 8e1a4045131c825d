from pathlib import Path

import pytest

from rlvr_core.core.registry import Registry


def test_registry_add_decorate_get_and_errors():
    r: Registry = Registry("widget")
    r.add("b", 2)

    @r.register("a")
    def a():
        return 1

    assert r.get("a") is a and r.get("b") == 2 and r.names() == ["a", "b"] and "a" in r
    with pytest.raises(ValueError, match="widget 'a' registered twice"):
        r.add("a", 3)
    with pytest.raises(KeyError, match=r"unknown widget 'c'; known: \['a', 'b'\]"):
        r.get("c")


def test_an_item_given_as_a_target_is_imported_when_first_looked_up():
    import json

    r: Registry = Registry("codec", {"dumps": "json:dumps"})
    assert r.names() == ["dumps"] and "dumps" in r
    assert r.get("dumps") is json.dumps
    with pytest.raises(ValueError, match="codec 'dumps' registered twice"):
        r.add("dumps", json.dumps)


def test_every_grpo_name_resolves_to_its_function_in_rlvr_core_grpo():
    """The names declared in rlvr_core/core/registry.py (what the config accepts) resolve, through the lookups the
    trainer uses, to functions of rlvr_core.grpo; and importing rlvr_core.grpo registers no name of its own (a
    config is checked without importing it, so such a name would be refused)."""
    import subprocess
    import sys

    from rlvr_core import grpo
    from rlvr_core.core import registry

    declared = {reg.kind: reg.names() for reg in (registry.ADVANTAGES, registry.KL_ESTIMATORS,
                                                  registry.LOSS_AGGS, registry.POLICY_LOSSES)}
    lookups = {"advantage estimator": grpo.get_advantage, "KL estimator": grpo.get_kl_estimator,
               "loss aggregation": grpo.get_loss_agg, "policy loss": grpo.get_policy_loss}
    assert sorted(declared) == sorted(lookups)
    for kind, names in declared.items():
        assert names, kind
        for name in names:
            fn = lookups[kind](name)
            assert callable(fn) and fn.__module__.startswith("rlvr_core.grpo."), (kind, name, fn)
    assert grpo.registries() == {"advantage": declared["advantage estimator"],
                                 "policy_loss": declared["policy loss"], "loss_agg": declared["loss aggregation"],
                                 "kl_estimator": declared["KL estimator"]}
    code = ("from rlvr_core.core import registry as r\n"
            "names = lambda: [x.names() for x in (r.ADVANTAGES, r.KL_ESTIMATORS, r.LOSS_AGGS, r.POLICY_LOSSES)]\n"
            "before = names()\nimport rlvr_core.grpo\nprint(before == names())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "True", out.stderr
