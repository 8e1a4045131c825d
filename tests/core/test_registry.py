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
