"""`rlvr probe …`: what did RL change? (registered in rlvr_cli/main.py as `app.add_typer(probe_app, name="probe")`).

Checkpoints are model folders: `--a PATH` is the reference (base model), `--b` the model(s) under study,
each `PATH`, `NAME=PATH` or `NAME@STEP=PATH`; `--training-run DIR --base PATH` adds every DeepSpeed
checkpoint of a GRPO run (exported and verified first, into DIR/probe-exports, and reused). Problems:
`--data FILE.jsonl` (rows with id, question, answer / final_answer), else the demo's synthetic held-out
split. Every command writes a folder (`--out`); `--publish PREFIX` also copies it into the artifact store.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from rlvr_core.artifacts.storage import open_store
from rlvr_core.core.progress import Progress
from rlvr_core.data.jsonl import read_jsonl
from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
from rlvr_core.probe.runs_report import training_run_report
from rlvr_core.probe.spikes import SpikeRule
from rlvr_core.probe.task import TaskSettings

probe_app = typer.Typer(no_args_is_help=True, help="Probes between checkpoints: token KL, Δlog p, capability boundary.")

_A = typer.Option(..., "--a", help="reference model folder (A), e.g. the base model")
_B = typer.Option(..., "--b", help="checkpoint(s) compared with A: PATH, NAME=PATH or NAME@STEP=PATH (repeatable)")
_OUT = typer.Option(..., "--out", help="output folder (report, figures, Parquet tables)")
_DATA = typer.Option(None, "--data", help="problems (jsonl); default: the demo's synthetic held-out split")
_MAXP = typer.Option(None, "--max-problems", help="use at most the first N problems")
_PUB = typer.Option(None, "--publish", help="also copy the folder into the artifact store under this key prefix")
_URI = typer.Option(None, "--artifact-uri", help="artifact store root (default: the configured one)")
_THREADS = typer.Option(None, "--threads", help="torch CPU threads")


def _rows(data: Optional[Path], max_problems: Optional[int]) -> list[dict]:
    if data is None:
        rows = make_synthetic_dataset(SyntheticSpec())["test"]
    else:
        rows = read_jsonl(data)
    return rows[: max_problems or None]


def _setup(threads: Optional[int]):
    import torch

    if threads:
        torch.set_num_threads(threads)
    return Progress()


def _checkpoints(b: list[str], training_run: Optional[Path], base: Optional[Path]):
    from rlvr_core.probe.checkpoints import parse_checkpoint, training_checkpoints

    cks = []
    if training_run is not None:
        if base is None:
            raise typer.BadParameter("--training-run needs --base (the base model folder the run started from)")
        # next to the run, not in the report folder: reused by later probes, never uploaded with a report
        cks += training_checkpoints(training_run, base, training_run / "probe-exports")
    cks += [parse_checkpoint(s) for s in b]
    names = [c.name for c in cks]
    if len(set(names)) != len(names):
        raise typer.BadParameter(f"checkpoint names must be distinct, got {names}")
    return cks


def _task(template: str, verifier: str, verifier_mode: Optional[str], max_new_tokens: int, seed: int):
    return TaskSettings(template_id=template, verifier=verifier, verifier_mode=verifier_mode,
                        max_new_tokens=max_new_tokens, seed=seed)


def _publish(out: Path, prefix: Optional[str], artifact_uri: Optional[str]) -> Optional[str]:
    if not prefix:
        return None

    store = open_store(artifact_uri)
    store.put_dir(prefix, out)
    return store.url(prefix)


_TEMPLATE = typer.Option("qa", "--template", help="prompt template id")
_VERIFIER = typer.Option("gsm8k", "--verifier", help="verifier name")
_VMODE = typer.Option(None, "--verifier-mode", help="verifier mode (e.g. strict)")
_MAXNEW = typer.Option(48, "--max-new-tokens")
_SEED = typer.Option(0, "--seed", help="sampling run seed")


@probe_app.command("tokens")
def tokens_command(
    a: Path = _A, b: list[str] = _B, out: Path = _OUT, data: Optional[Path] = _DATA,
    max_problems: Optional[int] = _MAXP,
    responses: str = typer.Option("reference", "--responses",
                                  help="what to score: 'reference' (the data's worked solutions), or a Parquet file of "
                                       "samples (problem_id, sample_index, response) or of rollouts (prompt_id, prompt, completion)"),
    template: str = _TEMPLATE, vocab_chunk: int = typer.Option(8192, "--vocab-chunk"),
    max_batch_tokens: int = typer.Option(8192, "--max-batch-tokens"),
    head: str = typer.Option("hidden", "--head", help="hidden (chunked lm_head) or logits (the model's own forward)"),
    threads: Optional[int] = _THREADS,
) -> None:
    """Teacher-forced per-token statistics (KL both ways, entropies, log-probs, Δlog p) -> probe_tokens.parquet."""
    import pyarrow.parquet as pq

    from rlvr_core.probe.checkpoints import load_checkpoint_model, parse_checkpoint
    from rlvr_core.probe.inputs import sequences_from_records, sequences_from_rollouts, sequences_from_rows
    from rlvr_core.probe.report import write_tables
    from rlvr_core.probe.tables import summarise, token_table
    from rlvr_core.probe.token_stats import teacher_forced_stats

    if head not in ("hidden", "logits"):
        raise typer.BadParameter(f"--head must be 'hidden' or 'logits', got {head!r}")
    progress = _setup(threads)
    ref = parse_checkpoint(str(a))
    cks = [parse_checkpoint(s) for s in b]
    model_a, tok = load_checkpoint_model(ref)
    rows = _rows(data, max_problems)
    if responses == "reference":
        seqs = sequences_from_rows(rows, tok, template)
    else:
        recs = pq.read_table(responses).to_pylist()
        seqs = (sequences_from_rollouts(recs, tok) if recs and "completion" in recs[0]
                else sequences_from_records(recs, {r["id"]: r for r in rows}, tok, template, source=Path(responses).stem))
    t0 = time.monotonic()
    stats = teacher_forced_stats(model_a, {c.name: load_checkpoint_model(c)[0] for c in cks}, seqs,
                                 pad_token_id=tok.pad_token_id or 0, head=head, vocab_chunk=vocab_chunk,
                                 max_batch_tokens=max_batch_tokens,
                                 progress=progress.counter("probe/tokens", "sequences"))
    tables = summarise(token_table(stats, seqs, tok, probe_id=f"tokens-{int(time.time())}", reference=ref.name,
                                   checkpoints=cks))
    write_tables(tables.as_dict(), out)
    n_tok = sum(len(s.response_ids) for s in seqs)
    typer.echo(json.dumps({"out": str(out), "sequences": len(seqs), "tokens": n_tok, "checkpoints": [c.name for c in cks],
                           "seconds": round(time.monotonic() - t0, 2)}))


@probe_app.command("report")
def report_command(
    a: Path = _A, b: list[str] = typer.Option([], "--b", help="checkpoint(s), last = B (see `--a`)"), out: Path = _OUT,
    training_run: Optional[Path] = typer.Option(None, "--training-run", help="GRPO output folder: add its step<N> checkpoints"),
    base: Optional[Path] = typer.Option(None, "--base", help="base model folder of --training-run (default: --a)"),
    data: Optional[Path] = _DATA, max_problems: Optional[int] = _MAXP,
    selection: str = typer.Option("a_fail_b_success", "--selection",
                                  help="a_fail_b_success, a_success_b_fail, both_fail, both_success or all"),
    responses_from: str = typer.Option("a", "--responses-from", help="whose greedy responses are teacher-forced (a or b)"),
    metric: str = typer.Option("kl_ba", "--metric", help="kl_ba (KL(B||A)), kl_ab, kl_sym or dlogp_abs"),
    rule: str = typer.Option("robust", "--spike-rule", help="robust (median + z·MAD), zscore (mean + z·std) or absolute"),
    z: float = typer.Option(3.0, "--z"), threshold: float = typer.Option(0.1, "--threshold", help="absolute rule"),
    min_value: float = typer.Option(1e-3, "--min-value", help="smallest value that can be a spike"),
    scope: str = typer.Option("sequence", "--scope", help="sequence or checkpoint (where centre and scale come from)"),
    template: str = _TEMPLATE, verifier: str = _VERIFIER, verifier_mode: Optional[str] = _VMODE,
    max_new_tokens: int = _MAXNEW, seed: int = _SEED, publish: Optional[str] = _PUB,
    artifact_uri: Optional[str] = _URI, threads: Optional[int] = _THREADS,
) -> None:
    """RL-Probe report: problems where A fails and B succeeds, token KL spikes, categories, checkpoint trajectory."""
    from rlvr_core.probe.checkpoints import parse_checkpoint
    from rlvr_core.probe.report import ProbeSettings, run_rl_probe

    try:  # settings first: a bad option fails before any checkpoint is exported or loaded
        settings = ProbeSettings(selection=selection, responses_from=responses_from, metric=metric,
                                 rule=SpikeRule(kind=rule, z=z, threshold=threshold, min_value=min_value, scope=scope),
                                 task=_task(template, verifier, verifier_mode, max_new_tokens, seed))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    progress = _setup(threads)
    ref = parse_checkpoint(str(a))
    cks = _checkpoints(b, training_run, base or a)
    if not cks:
        raise typer.BadParameter("give at least one --b or a --training-run")
    _, meta = run_rl_probe(ref, cks, _rows(data, max_problems), out, settings, progress=progress)
    meta["published"] = _publish(out, publish, artifact_uri)
    typer.echo(json.dumps({k: meta[k] for k in ("probe_id", "n_selected", "accuracy_a", "accuracy_b", "duration_s",
                                                "published")} | {"report": str(out / "report.md")}))


@probe_app.command("dlogp")
def dlogp_command(
    a: Path = _A, b: str = typer.Option(..., "--b", help="the RL checkpoint (PATH or NAME=PATH)"), out: Path = _OUT,
    data: Optional[Path] = _DATA, max_problems: Optional[int] = _MAXP,
    n_samples: int = typer.Option(4, "--n-samples", help="samples per problem and configuration"),
    rates: str = typer.Option("0.05,0.1,0.2,0.3", "--rates", help="target replacement rates"),
    criteria: str = typer.Option("dlogp,kl,entropy,random", "--criteria"),
    gammas: str = typer.Option("0,0.5,1,2,4", "--gammas", help="extrapolation strengths"),
    temperature: float = typer.Option(1.0, "--temperature"),
    template: str = _TEMPLATE, verifier: str = _VERIFIER, verifier_mode: Optional[str] = _VMODE,
    max_new_tokens: int = _MAXNEW, seed: int = _SEED, publish: Optional[str] = _PUB,
    artifact_uri: Optional[str] = _URI, threads: Optional[int] = _THREADS,
) -> None:
    """Δlog p: histograms vs magnitude metrics, top tokens, selective replacement, test-time extrapolation."""
    from rlvr_core.probe.checkpoints import parse_checkpoint
    from rlvr_core.probe.dlogp import DlogpSettings, run_dlogp_analysis

    try:
        settings = DlogpSettings(n_samples=n_samples, temperature=temperature,
                                 rates=tuple(float(x) for x in rates.split(",")), criteria=tuple(criteria.split(",")),
                                 gammas=tuple(float(x) for x in gammas.split(",")),
                                 task=_task(template, verifier, verifier_mode, max_new_tokens, seed))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    progress = _setup(threads)
    meta = run_dlogp_analysis(parse_checkpoint(str(a)), parse_checkpoint(b), _rows(data, max_problems), out, settings,
                              progress=progress)
    meta["published"] = _publish(out, publish, artifact_uri)
    typer.echo(json.dumps({k: meta[k] for k in ("probe_id", "accuracy", "duration_s", "published")}
                          | {"report": str(out / "dlogp_report.md")}))


@probe_app.command("boundary")
def boundary_command(
    a: Path = _A, b: str = typer.Option(..., "--b", help="the RL checkpoint (PATH or NAME=PATH)"), out: Path = _OUT,
    data: Optional[Path] = _DATA, max_problems: Optional[int] = _MAXP,
    n_samples: int = typer.Option(256, "--n-samples", help="samples per problem (pass@k up to this k)"),
    temperature: float = typer.Option(1.0, "--temperature"),
    ppl_per_problem: int = typer.Option(4, "--ppl-per-problem", help="correct responses per problem scored for perplexity"),
    template: str = _TEMPLATE, verifier: str = _VERIFIER, verifier_mode: Optional[str] = _VMODE,
    max_new_tokens: int = _MAXNEW, seed: int = _SEED, publish: Optional[str] = _PUB,
    artifact_uri: Optional[str] = _URI, threads: Optional[int] = _THREADS,
) -> None:
    """Capability boundary: pass@k up to large k, accuracy histogram, solvable overlap, perplexities."""
    from rlvr_core.probe.boundary import BoundarySettings, run_boundary_analysis
    from rlvr_core.probe.checkpoints import parse_checkpoint

    progress = _setup(threads)
    settings = BoundarySettings(n_samples=n_samples, temperature=temperature, ppl_per_problem=ppl_per_problem,
                                task=_task(template, verifier, verifier_mode, max_new_tokens, seed))
    meta = run_boundary_analysis(parse_checkpoint(str(a)), parse_checkpoint(b), _rows(data, max_problems), out,
                                 settings, progress=progress)
    meta["published"] = _publish(out, publish, artifact_uri)
    typer.echo(json.dumps({k: meta[k] for k in ("n_problems", "n_samples", "overlap", "crossing_k", "duration_s",
                                                "published")} | {"report": str(out / "boundary_report.md")}))


if __name__ == "__main__":  # `python -m rlvr_cli.probe …`, besides `rlvr probe …`
    probe_app()


@probe_app.command("runs")
def runs_command(
    out: Path = _OUT,
    run: list[str] = typer.Option([], "--run", help="run id (repeatable); default: every run of --experiment"),
    experiment: Optional[str] = typer.Option(None, "--experiment", help="every run of this experiment"),
    step: list[int] = typer.Option([], "--step", help="steps for the dynamics table (repeatable); default: first, middle, last"),
    warehouse_path: Optional[Path] = typer.Option(None, "--warehouse", help="warehouse file (default: the configured one)"),
) -> None:
    """Training-run analysis across runs from the warehouse: differing hyperparameters, final accuracies with
    intervals, dynamics at chosen steps, guard firings (seed 002)."""
    try:
        r = training_run_report(out, run_ids=run or None, experiment=experiment, steps=step or None, db=warehouse_path)
    except (ValueError, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    typer.echo(f"{out / 'training_report.md'}: {len(r['runs'])} runs, {len(r['varied_params'])} differing params, "
               f"{len(r['guard_firings'])} guard firings")
