"""Verifiers by name. Importing this package registers the built-in verifiers.

Each built-in lives in its own module and registers itself with `@register_verifier(NAME)` (the project's
one registry, rlvr_core/core/registry.py, which lists the names and imports those modules on the first lookup). Heavy dependencies
(math-verify, sympy, langdetect) are imported inside those modules only when a verifier is built or used.
"""

from rlvr_core.verifiers.base import (Outcome, Status, Verifier, error_outcome, register_verifier, safe_verify,
                                      shaped_reward)
from rlvr_core.verifiers.registry import (can_hang, default_mode, default_workers, get_verifier, known_verifiers,
                                          verifier_class)

__all__ = [
    "Outcome",
    "Status",
    "Verifier",
    "can_hang",
    "default_mode",
    "default_workers",
    "error_outcome",
    "get_verifier",
    "known_verifiers",
    "register_verifier",
    "safe_verify",
    "shaped_reward",
    "verifier_class",
]
