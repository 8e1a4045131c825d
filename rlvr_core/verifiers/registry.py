"""Verifiers by name: the built-ins (each registers itself with `@register_verifier`, in its own module, which
the project's registry imports on first lookup: rlvr_core/core/registry.py) and `package.module:name` for a
verifier another module registers. Config validation, the pool and every stage look verifiers up here."""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from rlvr_core.verifiers.base import VERIFIERS, Verifier

__all__ = ["get_verifier", "verifier_class", "can_hang", "default_workers", "default_mode", "known_verifiers"]


def get_verifier(name: str, **options: Any) -> Verifier:
    """Build the verifier registered as `name` with its options (e.g. mode="strict")."""
    return verifier_class(name)(**options)


def verifier_class(name: str) -> Callable[..., Verifier]:
    """The registered factory of `name` (its `can_hang` and other declarations), without building it.

    `name` is a built-in's name, or `package.module:name` for a verifier that module registers: the module
    is imported first, here and in every pool worker (a name registered only in a script's other modules
    would be unknown to the workers).
    """
    key = name
    if name not in VERIFIERS.live() and ":" in name:
        module, _, key = name.partition(":")
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise KeyError(f"verifier {name!r}: cannot import {module!r} ({exc})") from None
    try:
        return VERIFIERS.get(key)
    except KeyError:
        raise KeyError(f"unknown verifier {name!r}; known: {known_verifiers()}") from None


def can_hang(name: str) -> bool:
    return verifier_class(name).can_hang


def default_workers(name: str) -> int:
    """Worker processes a verifier gets unless told otherwise: none (in-process, the fastest) for verifiers
    that cannot hang, 2 for the others (a hang then holds up no other verification)."""
    return 2 if can_hang(name) else 0


def known_verifiers() -> list[str]:
    VERIFIERS.load()
    return VERIFIERS.live()


def default_mode(name: str) -> str | None:
    """The mode a verifier uses when none is given (None for verifiers without modes)."""
    param = inspect.signature(verifier_class(name)).parameters.get("mode")
    return None if param is None or param.default is inspect.Parameter.empty else param.default
