"""The cluster's two work pools, one for the CPU stages and one for the GPU stages, from the job templates in
infra/prefect: the same template with each pool's defaults (docs/gpu.md, "A cluster, end to end").

    python -m flows.pools kubernetes cpu > cpu.json
    prefect work-pool create rlvr-cpu --type kubernetes --base-job-template cpu.json
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

INFRA = Path(__file__).resolve().parent.parent / "infra" / "prefect"
KINDS = ("process", "docker", "kubernetes")
# Each pool's defaults over the template's own (the GPU pool keeps the template's).
ROLES: dict[str, dict[str, dict[str, Any]]] = {
    "kubernetes": {
        "gpu": {},
        "cpu": {"gpus": 0, "cpu": "4", "memory": "16Gi", "node_selector": {"rlvr.io/pool": "cpu"}},
    },
    "docker": {"gpu": {}, "cpu": {"device_requests": [], "shm_size": "1g"}},
    "process": {"gpu": {}, "cpu": {}},
}


def pool_template(kind: str, role: str) -> dict[str, Any]:
    """The base job template of the `role` ("cpu" or "gpu") pool of worker type `kind`."""
    if kind not in KINDS or role not in ROLES[kind]:
        raise ValueError(f"no pool {kind!r}/{role!r}: kinds {', '.join(KINDS)}, roles cpu, gpu")
    template = json.loads((INFRA / f"{kind}-base-job-template.json").read_text())
    props = template["variables"]["properties"]
    for name, value in ROLES[kind][role].items():
        props[name] = {**props[name], "default": copy.deepcopy(value)}
    return template


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: python -m flows.pools {{{','.join(KINDS)}}} {{cpu,gpu}}", file=sys.stderr)
        return 2
    try:
        print(json.dumps(pool_template(argv[1], argv[2]), indent=2))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
