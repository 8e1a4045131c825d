"""What every config model shares: the one-message `ConfigError`, the strict pydantic base (unknown keys
refused, defaults validated, frozen) and the registry-name check."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_serializer


class ConfigError(ValueError):
    """A config that cannot be used. `str()` is the one message a user needs: file, field path, why."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems  # (field path, why)
        lines = [f"{source}: {path}: {why}" if path else f"{source}: {why}" for path, why in problems]
        super().__init__("invalid config\n" + "\n".join("  " + line for line in lines))

    def __reduce__(self) -> tuple:
        # Pickled with its own arguments (a stage's failure persisted by Prefect, a raised teacher check), not
        # with the message alone, which __init__ would not take.
        return type(self), (self.source, self.problems)


def _one_of(value: str, known: list[str], what: str) -> str:
    """Names that map to a registry are checked at load time, not when the stage finally runs."""
    if value not in known:
        raise ValueError(f"unknown {what} {value!r}; known: {', '.join(known)}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=True)


class _AddedLater(_Strict):
    """A section with fields added after configs were hashed and keyed: those fields (`_ADDED_LATER`) are dumped only
    away from their defaults, so every earlier config keeps its resolved form, its hash and its cache keys."""

    _ADDED_LATER: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _hide_added_defaults(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        for name in self._ADDED_LATER:
            default = type(self).model_fields[name].get_default(call_default_factory=True)
            if isinstance(default, BaseModel):
                default = default.model_dump(mode="json")
            value = out.get(name)
            if name in out and (value == default or (isinstance(default, tuple) and value == list(default))):
                del out[name]
        return out


# Users and the stage protocol know the error by its public home (`error_type` in a stage's failure report).
ConfigError.__module__ = "rlvr_core.experiment.config"
