"""What every config model shares: the one-message `ConfigError`, the strict pydantic base (unknown keys
refused, defaults validated, frozen) and the registry-name check."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config that cannot be used. `str()` is the one message a user needs: file, field path, why."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems  # (field path, why)
        lines = [f"{source}: {path}: {why}" if path else f"{source}: {why}" for path, why in problems]
        super().__init__("invalid config\n" + "\n".join("  " + line for line in lines))


def _one_of(value: str, known: list[str], what: str) -> str:
    """Names that map to a registry are checked at load time, not when the stage finally runs."""
    if value not in known:
        raise ValueError(f"unknown {what} {value!r}; known: {', '.join(known)}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=True)


# Users and the stage protocol know the error by its public home (`error_type` in a stage's failure report).
ConfigError.__module__ = "rlvr_core.experiment.config"
