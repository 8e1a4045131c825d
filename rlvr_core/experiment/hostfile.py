"""A DeepSpeed hostfile for `grpo.launch.mode: deepspeed` (docs/gpu.md, "Multi-node"): `HOST slots=N` lines, `#`
comments and blank lines, read with DeepSpeed's own parser (`deepspeed.launcher.runner`) line by line, so the
semantics are DeepSpeed's and an error names the file and line; `include`/`exclude` are DeepSpeed's
`--include`/`--exclude` filters (`host1@host2:0,1`)."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path


def read_hostfile(path: str, include: str = "", exclude: str = "", *, nnodes: int,
                  nproc_per_node: int) -> dict[str, list[int]]:
    """{host: [local slot ids]} in the file's order (node 0 first), after the filters; `ValueError` naming the
    file (and line) when the file is missing, a line is bad, or the group differs from nnodes x nproc_per_node."""
    from deepspeed.launcher.runner import _parse_hostfile, parse_inclusion_exclusion

    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"grpo.launch.hostfile {path}: no such file")
    pool, where = {}, {}
    quiet = logging.getLogger("DeepSpeed")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # its parser logs the whole file before raising
    try:
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if not line.strip() or line.strip().startswith("#"):
                continue
            try:
                [(host, slots)] = _parse_hostfile([line]).items()
            except ValueError:
                raise ValueError(f"{path}:{n}: not 'HOST slots=N': {line.strip()!r}") from None
            if host in pool:
                raise ValueError(f"{path}:{n}: host {host} is already on line {where[host]}")
            pool[host], where[host] = slots, n
        if not pool:
            raise ValueError(f"{path}: no 'HOST slots=N' line")
        try:
            world = dict(parse_inclusion_exclusion(pool, include, exclude))
        except ValueError as e:
            raise ValueError(f"{path}: grpo.launch.include/exclude: {e}") from None
    finally:
        quiet.setLevel(level)
    _check_shape(path, world, where, nnodes, nproc_per_node)
    return world


def _check_shape(path: str, world: dict[str, list[int]], where: dict[str, int], nnodes: int, nproc: int) -> None:
    if len(world) != nnodes:
        raise ValueError(f"{path}: {len(world)} host(s) after include/exclude ({', '.join(world)}), but "
                         f"grpo.launch.nnodes is {nnodes}")
    for host, slots in world.items():
        if len(slots) != nproc:
            raise ValueError(f"{path}:{where[host]}: host {host} has {len(slots)} slot(s) in use, but "
                             f"grpo.launch.nproc_per_node is {nproc} (every node runs the same number of ranks)")


def encode_world_info(world: dict[str, list[int]]) -> str:
    """`deepspeed.launcher.launch --world_info`: urlsafe base64 of the JSON {host: [slots]} (as its runner)."""
    return base64.urlsafe_b64encode(json.dumps(world).encode()).decode()
