"""False stops of the training guards on healthy runs: replay the run-level detectors over recorded GRPO runs.

Every finished GRPO run in the given RLVR homes (`<home>/cache/grpo/<key>/steps.parquet` with `summary.json`
done) is replayed through `check_health` with the settings it ran with (`grpo.guards.health`, flat as `health` in
its cache key), after giving its rows the base model's numbers on the prompts each step drew (`base/*`, as the
trainer writes them since the pass-rate table travels with the curriculum) when the rows predate them: the curriculum and its
pass-rate table are in the same home's cache. The detectors are pure functions of the rows, so a replay gives
the firings a run would have had; runs trained before the guards changed need no re-training.

    python benchmarks/guard_calibration.py /tmp/rlvr-demo-grid/* [--json out.json]

Prints one line per run (steps, serious firings = false stops, flags) and the false-stop rate over all runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlvr_core.experiment.guards import HealthConfig, check_health  # noqa: E402
from rlvr_core.grpo.step_metrics import base_columns  # noqa: E402
from rlvr_core.pipeline.stages import BASE_ROLLOUT_COLUMNS  # noqa: E402


def _base_table(home: Path, curriculum_id: str) -> dict[str, dict[str, float]]:
    """{prompt id: base numbers} from the run's curriculum, or from its pass-rate table when the curriculum
    predates the base columns."""
    folder = home / "cache" / "curriculum" / curriculum_id
    table = pq.read_table(folder / "curriculum.parquet")
    if "mean_length" not in table.column_names:
        table_id = json.loads((folder / "manifest.json").read_text())["table"]
        table = pq.read_table(home / "cache" / "pass_rate_table" / table_id / "pass_rate_table.parquet")
    cols = {src: dst for src, dst in BASE_ROLLOUT_COLUMNS.items() if src in table.column_names}
    data = {src: table.column(src).to_pylist() for src in cols}
    return {pid: {dst: float(data[src][i]) for src, dst in cols.items()}
            for i, pid in enumerate(table.column("problem_id").to_pylist())}


def replay(home: Path, run: Path) -> dict:
    key = json.loads((run / "cache_key.json").read_text())
    rows = pq.read_table(run / "steps.parquet").to_pylist()
    ids = pq.read_table(home / "cache" / "curriculum" / key["curriculum"] / "curriculum.parquet",
                        columns=["problem_id"]).column("problem_id").to_pylist()
    if rows and "base/reward_mean" not in rows[0]:
        base, order, pos = _base_table(home, key["curriculum"]), [{"id": i} for i in ids], 0
        for r in rows:
            r.update(base_columns(base, order, pos, int(r["dynamic/prompts_consumed"])))
            pos += int(r["dynamic/prompts_consumed"])
    firings = check_health(rows, HealthConfig.model_validate((key.get("grpo") or {}).get("health") or {}))
    return {"run": str(run), "steps": len(rows), "lr": key["grpo"].get("lr"), "seed": key.get("seed"),
            "stops": [(f.guard_id, f.step) for f in firings if f.serious],
            "flags": [(f.guard_id, f.step) for f in firings if not f.serious]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("homes", type=Path, nargs="+")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    out = []
    for home in a.homes:
        for run in sorted((home / "cache" / "grpo").glob("*/steps.parquet")):
            summary = run.parent / "summary.json"
            if summary.is_file() and json.loads(summary.read_text()).get("done"):
                out.append(replay(home, run.parent))
                r = out[-1]
                print(f"{r['run']}: {r['steps']} steps, lr {r['lr']}, stops {r['stops'] or 'none'}, "
                      f"flags {r['flags'] or 'none'}")
    stopped = sum(bool(r["stops"]) for r in out)
    print(f"false stops: {stopped} of {len(out)} healthy runs")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
