"""The `sampling.push` section: how the trainer's weights reach `vllm serve` processes, one model per
transport told apart by `type` (`rlvr_core/sampling/weight_push/` has one module per transport).

    sampling:
      push: {type: file, folder: /shared/run1/weight_push, timeout_s: 120}   # or gloo | nccl | ipc

The transport names, and the one alias (`rlvr_file`, another name of `file`), are decided here: the config,
the trainer's transports and the servers' weight-transfer backend all read them from this module. It imports
pydantic only, because a `vllm serve` worker imports it too. The flat keys the section replaced
(`sampling.server_push_backend`, ...) are still read, with a one-line deprecation naming the new key.
"""

from __future__ import annotations

from typing import Annotated, Any, Callable, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

__all__ = ["PUSH_TYPES", "PUSH_ALIASES", "PushConfig", "FilePush", "GlooPush", "NcclPush", "IpcPush", "push_type",
           "push_section", "push_config", "move_flat_push_keys", "moved_push_key", "FLAT_PUSH_KEYS"]

PUSH_TYPES = ("file", "gloo", "nccl", "ipc")
PUSH_ALIASES = {"rlvr_file": "file"}  # another name of `file`, also accepted as the servers' backend name
# the flat sampling keys this section replaced -> their key in sampling.push
FLAT_PUSH_KEYS = {"server_push_backend": "type", "server_push_timeout_s": "timeout_s",
                  "server_push_folder": "folder", "server_workers": "workers"}


def push_type(name: Any) -> str:
    """`name` as one of PUSH_TYPES (an alias mapped); ValueError naming the known ones."""
    name = PUSH_ALIASES.get(name, name) if isinstance(name, str) else name
    if name not in PUSH_TYPES:
        raise ValueError(f"unknown weight push type {name!r}; expected 'file', 'gloo', 'nccl' or 'ipc'")
    return name


class _Push(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=True)

    @classmethod
    def kind(cls) -> str:
        """The transport's name (its `type`)."""
        return cls.model_fields["type"].default

    timeout_s: float = Field(120.0, gt=0, description="each call of a weight push (start, update, finish) and each "
                             "version check; a server that does not answer within it is an error naming it")


class FilePush(_Push):
    type: Literal["file"] = Field("file", description="a safetensors file per version in `folder`, loaded by the "
                                  "servers (CPU or GPU, any machine that sees the folder; rlvr_file is the same)")
    folder: str | None = Field(None, description="folder the trainer writes weight versions to and the servers "
                               "read (a shared disk across machines); default: the GRPO run's own folder "
                               "(weight_push/)")


class _Collective(_Push):
    workers: int = Field(1, ge=1, description="worker processes of each server (its tensor x pipeline x data "
                         "parallel size); the push group is the trainer plus these")


class GlooPush(_Collective):
    type: Literal["gloo"] = Field("gloo", description="a torch gloo broadcast from the trainer (CPU, servers it "
                                  "can reach over TCP)")


class NcclPush(_Collective):
    type: Literal["nccl"] = Field("nccl", description="vLLM's NCCL broadcast (CUDA, servers on other GPUs)")


class IpcPush(_Push):
    type: Literal["ipc"] = Field("ipc", description="vLLM's CUDA IPC (servers on the trainer's GPU)")


PushConfig = Annotated[Union[FilePush, GlooPush, NcclPush, IpcPush], Field(discriminator="type")]
_ADAPTER: TypeAdapter = TypeAdapter(PushConfig)
_MODELS = {m.kind(): m for m in (FilePush, GlooPush, NcclPush, IpcPush)}


def push_section(value: Any) -> Any:
    """A `push` value as the union reads it: a type name becomes `{type: name}`, a missing type is `file`, an
    alias is mapped, and a null option the type does not have is dropped (a resolved config's `folder: null`
    after `--set sampling.push.type=gloo`). Anything else is left to the union's own check."""
    if isinstance(value, str):
        value = {"type": value}
    if isinstance(value, dict):
        kind = _MODELS[push_type(value.get("type", "file"))]
        value = {**{k: v for k, v in value.items() if v is not None or k in kind.model_fields}, "type": kind.kind()}
    return value


def moved_push_key(dotted: str) -> str | None:
    """A flat push key's new path (`sampling.server_push_backend` -> `sampling.push.type`); None for any other."""
    head, _, old = dotted.partition(".")
    new = FLAT_PUSH_KEYS.get(old) if head == "sampling" else None
    return f"sampling.push.{new}" if new else None


def push_config(value: Any = None) -> FilePush | GlooPush | NcclPush | IpcPush:
    """A push config from a config, a mapping or a type name (None: the default, `file`)."""
    if isinstance(value, _Push):
        return value
    return _ADAPTER.validate_python(push_section({} if value is None else value))


def move_flat_push_keys(sampling: dict, say_moved: Callable[[str, str], None]) -> dict:
    """The `sampling` mapping with the flat push keys moved into `push`, each told to `say_moved(old, new)` (the
    config's one-line deprecation); a key set both ways is a ValueError naming both. A moved key its transport
    does not have (a folder with gloo) is dropped: it had no effect before either."""
    flat = {k: sampling[k] for k in FLAT_PUSH_KEYS if k in sampling}
    push = sampling.get("push")
    if not flat or not isinstance(push, (dict, str, type(None))):
        return sampling
    push = {"type": push} if isinstance(push, str) else dict(push or {})
    for old, value in flat.items():
        new = FLAT_PUSH_KEYS[old]
        if new in push:
            raise ValueError(f"sampling.{old} and sampling.push.{new} are both set: sampling.{old} is the old name, "
                             f"keep sampling.push.{new}")
        say_moved(f"sampling.{old}", f"sampling.push.{new}")
        push[new] = value
    name = push.get("type", "file")
    kind = _MODELS.get(PUSH_ALIASES.get(name, name)) if isinstance(name, str) else None  # None: the union names it
    moved = {FLAT_PUSH_KEYS[k] for k in flat}
    push = {k: v for k, v in push.items() if kind is None or k in kind.model_fields or k not in moved}
    return {**{k: v for k, v in sampling.items() if k not in FLAT_PUSH_KEYS}, "push": push}
