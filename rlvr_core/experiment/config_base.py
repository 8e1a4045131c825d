"""What every config model shares: the one-message `ConfigError`, the strict pydantic base (unknown keys
refused, defaults validated, frozen), the registry-name check, the one way a field added after runs were keyed
stays out of their dumps (`AddedLater`), and the declaration of the fields that name the training folder (`InKey`,
`NamesRun`, `key_dump`)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_serializer


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


def one_of(value: str, known: list[str], what: str) -> str:
    """Names that map to a registry are checked at load time, not when the stage finally runs."""
    if value not in known:
        raise ValueError(f"unknown {what} {value!r}; known: {', '.join(known)}")
    return value


class Strict(BaseModel):
    """The base of every config model: unknown keys refused, defaults validated, frozen."""

    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=True)


class AddedLater(Strict):
    """A model with fields added after configs were hashed and keyed: those fields (`_ADDED_LATER`) are dumped only
    away from their defaults (the behaviour every earlier config had), so every earlier config keeps its resolved
    form, its hash and its cache and training keys."""

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


def InKey(*args: Any, **kwargs: Any) -> Any:
    """`Field` for a setting that changes the trained weights, so it names the training folder: a run with another
    value trains anew (`grpo_key_dump`, `key_dump`)."""
    return Field(*args, json_schema_extra={"in_key": True, "changes_weights": True}, **kwargs)


def NamesRun(*args: Any, **kwargs: Any) -> Any:
    """`Field` for a setting that does not change the trained weights (when to checkpoint, evaluate or write sample
    rows) but is in the training folder's key because runs were keyed with it: taking it out would move every
    earlier run's folder. A run with another value still trains anew, from step 0."""
    return Field(*args, json_schema_extra={"in_key": True, "changes_weights": False}, **kwargs)


def key_fields(model: type[BaseModel], *, changes_weights: bool | None = None) -> list[str]:
    """The fields of `model` declared with `InKey` or `NamesRun` (only the one kind with `changes_weights`)."""
    out = []
    for name, f in model.model_fields.items():
        extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
        if extra.get("in_key") is True and changes_weights in (None, extra.get("changes_weights")):
            out.append(name)
    return out


def key_dump(section: BaseModel) -> dict[str, Any]:
    """The settings of `section` that name the training folder: its fields declared `InKey` or `NamesRun`."""
    return section.model_dump(mode="json", include=set(key_fields(type(section))))


# Users and the stage protocol know the error by its public home (`error_type` in a stage's failure report).
ConfigError.__module__ = "rlvr_core.experiment.config"
