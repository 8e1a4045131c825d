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


def test_a_kinds_home_module_is_imported_when_a_name_is_first_looked_up(tmp_path, monkeypatch):
    """A kind's built-ins register themselves with the decorator when their home module is imported, which the
    first lookup of a name not registered yet does; the declared names are accepted before that."""
    import sys

    from rlvr_core.core import registry

    (tmp_path / "_codec_home.py").write_text("import json\nfrom rlvr_core.core.registry import register\n"
                                             "register('codec', 'dumps')(json.dumps)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r: Registry = Registry("codec", ("dumps",), ("_codec_home",))
    monkeypatch.setitem(registry.KINDS, "codec", r)
    assert r.names() == ["dumps"] and "dumps" in r and r.live() == [] and "_codec_home" not in sys.modules
    import json

    assert registry.lookup("codec", "dumps") is json.dumps and r.live() == ["dumps"]
    with pytest.raises(ValueError, match="codec 'dumps' registered twice"):
        r.add("dumps", json.dumps)
    with pytest.raises(KeyError, match=r"unknown codec 'loads'; known: \['dumps'\]"):
        registry.lookup("codec", "loads")


def _registrations() -> list[tuple[str, str, str]]:
    """(kind, name, module) of every `register(...)`/`@register(...)` call with literal arguments in rlvr_core, and
    of the kind-specific aliases (`@register_verifier(NAME)`), read from the source."""
    import ast

    aliases = {"register_verifier": "verifier", "register_advantage": "advantage", "register_policy_loss":
               "policy_loss", "register_loss_agg": "loss_agg", "register_kl_estimator": "kl_estimator"}
    out = []
    root = Path(__file__).resolve().parents[2]
    for path in sorted((root / "rlvr_core").rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            args = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if node.func.id == "register" and len(args) == 2:
                out.append((args[0], args[1], module))
            elif node.func.id in aliases and len(args) == 1:
                out.append((aliases[node.func.id], args[0], module))
    return out


def test_the_torch_free_names_are_the_live_registry():
    """KINDS (torch-free, what the config checks) lists exactly the names rlvr_core registers: after importing
    every kind's home modules in a fresh process, each registry holds its declared names and no other; and every
    registration in rlvr_core's source is of a declared name, in a home module of its kind (a name registered
    elsewhere would be unknown until that module happened to be imported)."""
    import json
    import subprocess
    import sys

    from rlvr_core.core.registry import KINDS

    code = ("import json; from rlvr_core.core.registry import KINDS\n"
            "[r.load() for r in KINDS.values()]\n"
            "print(json.dumps({k: [r.live(), sorted(r.declared)] for k, r in KINDS.items()}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    for kind, (live, declared) in json.loads(out.stdout.strip().splitlines()[-1]).items():
        assert declared and live == declared, (kind, live, declared)
    found = _registrations()
    assert {k for k, _, _ in found} == set(KINDS)
    for kind, name, module in found:
        assert name in KINDS[kind].declared and module in KINDS[kind].home, (kind, name, module)
    assert sorted((k, n) for k, n, _ in found) == sorted((k, n) for k, r in KINDS.items() for n in r.declared)


def test_the_engine_choice_of_the_config_is_the_rollout_engines():
    """sampling.engine's choices (a Literal, for the JSON schema) are the rollout engines' names."""
    from typing import get_args

    from rlvr_core.core.registry import ROLLOUT_ENGINES
    from rlvr_core.experiment.sampling_config import SamplingConfig

    assert sorted(get_args(SamplingConfig.model_fields["engine"].annotation)) == sorted(ROLLOUT_ENGINES.declared)


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
