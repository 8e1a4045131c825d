"""A static HTML report of one run, written into the artifact store beside the run's files.

`build_report(run_id)` runs the dashboard's canned queries (dashboards/queries/*.sql, through
rlvr_core.records.warehouse_queries) for one run, draws the figures with matplotlib (PNG) and writes

    <run folder>/reports/index.html
    <run folder>/reports/figures/*.png

into the run's folder in the artifact store (a local folder or S3; found from the warehouse's ingest log,
rlvr_core.artifacts.layout). The page is self-contained: its figures are embedded as data: URIs, so it shows them
opened alone (downloaded from a bucket, mailed); the PNG files beside it are for browsing. A run whose
folder is gone from the store gets no report (ReportError), rather than a report of missing files. Same
numbers as the Streamlit app, because it is the same SQL.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import math
import tempfile
from pathlib import Path
from typing import Any

from rlvr_core.artifacts.artifacts_index import write_run_index
from rlvr_core.artifacts.layout import RUN_FILE, resolve_run
from rlvr_core.artifacts.storage import ArtifactStore, join, open_store
from rlvr_core.core import settings
from rlvr_core.records import warehouse
from rlvr_core.records import warehouse_queries as wq

# matplotlib loads only when a figure is drawn (`_plt`): the command line imports this module at start-up.

REPORT_DIR = "reports"
# The training metrics drawn when a run has them (all metrics are in the warehouse; these tell the story).
CURVE_METRICS = ("reward_mean", "loss", "entropy", "kl_ref_mean", "grad_norm", "completion_len_mean")


class ReportError(ValueError):
    """The run is not in the warehouse (or the warehouse is missing)."""


# ------------------------------------------------------------------------------------------- figures
def _plt():
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in tests
    import matplotlib.pyplot as plt

    return plt


def plot_training_curves(curves: list[dict], firings: list[dict], dest: Path) -> Path | None:
    """One panel per metric; guard firings as vertical lines (red: stopped the run, orange: a flag)."""
    present = {r["metric"] for r in curves}
    # The story metrics first; a run without them shows its first other plain metrics (not status/*, health/*).
    metrics = [m for m in CURVE_METRICS if m in present] or sorted(m for m in present if "/" not in m)[:6]
    if not metrics:
        return None
    plt = _plt()
    cols = 2 if len(metrics) > 1 else 1
    rows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 2.6 * rows), squeeze=False)
    for ax, metric in zip(axes.flat, metrics):
        pts = sorted((r["step"], r["value"]) for r in curves if r["metric"] == metric)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=1.4, color="#1f77b4")
        for f in firings:
            ax.axvline(f["step"], color="#d62728" if f["serious"] else "#ff7f0e", ls="--", lw=1, alpha=0.8)
        ax.set_title(metric, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    if firings:
        fig.suptitle("dashed: guard firings (red = stopped the run, orange = flag)", fontsize=9)
    fig.tight_layout()
    fig.savefig(dest, dpi=110)
    plt.close(fig)
    return dest


def plot_passk(curves: list[dict], dest: Path) -> Path | None:
    if not curves:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for source in sorted({r["source"] for r in curves}):
        pts = sorted((r["k"], r["value"]) for r in curves if r["source"] == source)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=source)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dest, dpi=110)
    plt.close(fig)
    return dest


def plot_diff(diff: list[dict], dest: Path) -> Path | None:
    """Sampled solve rate per problem, before vs after: points above the diagonal got better."""
    pts = [(r["sampled_a"], r["sampled_b"], r["change"]) for r in diff
           if r["sampled_a"] is not None and r["sampled_b"] is not None]
    if not pts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    colours = {"fixed": "#2ca02c", "broken": "#d62728", "both_right": "#1f77b4", "both_wrong": "#7f7f7f"}
    for change, colour in colours.items():
        sel = [(a, b) for a, b, c in pts if c == change]
        if sel:
            ax.scatter([a for a, _ in sel], [b for _, b in sel], s=18, alpha=0.7, color=colour, label=change)
    ax.plot([0, 1], [0, 1], color="black", lw=0.8)
    ax.set_xlabel(f"sampled solve rate, {diff[0]['checkpoint_a']}")
    ax.set_ylabel(f"sampled solve rate, {diff[0]['checkpoint_b']}")
    ax.set_xlim(-0.03, 1.03)
    ax.set_ylim(-0.03, 1.03)
    ax.legend(fontsize=7, title="greedy outcome", title_fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(dest, dpi=110)
    plt.close(fig)
    return dest


def plot_probe(trajectory: list[dict], categories: list[dict], dest: Path) -> Path | None:
    """Left: mean KL to the reference per compared checkpoint (± sd over sequences); right: by token
    category at the last compared checkpoint."""
    if not trajectory:
        return None
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    for probe in sorted({r["probe_id"] for r in trajectory}):
        pts = sorted((r["step"] or 0, r["mean_kl"], r["std_kl"] or 0.0) for r in trajectory if r["probe_id"] == probe)
        xs, ys, sd = [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts]
        left.plot(xs, ys, marker="o", label=probe)
        left.fill_between(xs, [y - s for y, s in zip(ys, sd)], [y + s for y, s in zip(ys, sd)], alpha=0.15)
    left.set_xlabel("training step")
    left.set_ylabel("mean KL per sequence")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    if categories:
        last = max(categories, key=lambda r: r["step"] or 0)
        rows = [r for r in categories if r["checkpoint"] == last["checkpoint"] and r["probe_id"] == last["probe_id"]]
        right.barh([r["category"] for r in rows], [r["mean_kl"] or 0.0 for r in rows], color="#9467bd")
        right.set_title(f"by token category, {last['checkpoint']}", fontsize=9)
        right.set_xlabel("mean KL per token")
        right.locator_params(axis="x", nbins=4)
        right.tick_params(labelsize=8)
        right.invert_yaxis()
    else:
        right.axis("off")
    fig.tight_layout()
    fig.savefig(dest, dpi=110)
    plt.close(fig)
    return dest


# ------------------------------------------------------------------------------------------- HTML
def _cell(v: Any) -> str:
    if v is None:
        return "<td class=null>–</td>"
    if isinstance(v, float):
        return f"<td class=num>{v:.4g}</td>"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"<td class=num>{v}</td>"
    return f"<td>{html.escape(str(v))}</td>"


def _table(rows: list[dict], columns: list[str] | None = None, limit: int = 200) -> str:
    if not rows:
        return "<p class=empty>No rows.</p>"
    cols = columns or list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(_cell(r.get(c)) for c in cols) + "</tr>" for r in rows[:limit])
    more = f"<p class=empty>… {len(rows) - limit} more rows in the warehouse.</p>" if len(rows) > limit else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def _figure(path: Path | None, alt: str) -> str:
    """The PNG embedded in the page (a data: URI): the page needs no file beside it."""
    if not path:
        return "<p class=empty>No data.</p>"
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}" title="figures/{path.name}">'


def run_folder(store: ArtifactStore, run_id: str, warehouse_path: str | Path | None = None) -> str:
    """The run's folder in `store`: where the warehouse last ingested it from, else looked up by run id.
    ReportError when the store does not hold it (its files are gone, or this is another store)."""
    rows = warehouse.query_records("SELECT run_prefix FROM ingest_log WHERE run_id = ?", [run_id], warehouse_path)
    prefix = rows[0]["run_prefix"] if rows else None
    if prefix and store.exists(join(prefix, RUN_FILE)):
        return prefix
    try:
        return resolve_run(store, run_id)
    except FileNotFoundError:
        raise ReportError(f"run {run_id!r} is in the warehouse but its folder {prefix or '(unknown)'} is not in the "
                          f"artifact store {store.uri}: its files are gone, or give --artifact-uri of the store "
                          "it was written to") from None


_CSS = """
body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:1100px;color:#222;padding:0 1rem}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.82rem;margin:.5rem 0}th,td{border:1px solid #ddd;padding:.2rem .45rem}
th{background:#f4f4f4;text-align:left}td.num{text-align:right;font-variant-numeric:tabular-nums}
td.null,p.empty{color:#999}img{max-width:100%;border:1px solid #eee}code{background:#f4f4f4;padding:0 .2rem}
"""


def build_report(run_id: str, *, store: ArtifactStore | None = None, warehouse_path: str | Path | None = None) -> str:
    """Write the report of `run_id` into the artifact store; returns the URL of its index.html."""
    store = store or open_store()
    q = lambda name, **p: wq.records(name, p, warehouse_path)  # noqa: E731
    overview = q("run_overview", run_id=run_id)
    if not overview:
        raise ReportError(f"run {run_id!r} is not in the warehouse {warehouse_path or settings.warehouse_path()} "
                          "(ingest it first: rlvr warehouse ingest EXPERIMENT/FOLDER)")
    run = overview[0]
    folder = run_folder(store, run_id, warehouse_path)  # before any work: no report of a run whose files are gone
    metrics = q("run_eval_metrics", run_id=run_id)
    checkpoints = q("run_checkpoints", run_id=run_id)
    curves = q("training_curves", runs=[run_id], metrics=None)
    firings = q("guard_firings", runs=[run_id])
    passk = q("passk_curves", runs=[run_id])
    evaluated = sorted({m["checkpoint"] for m in metrics if m["checkpoint"]})
    after = [c for c in evaluated if c != "base"]
    diff = (q("per_problem_diff", run_a=run_id, run_b=run_id, checkpoint_a="base", checkpoint_b=after[-1])
            if "base" in evaluated and after else [])
    probe_trajectory = q("probe_checkpoints", run_id=run_id)
    probe_categories = q("probe_categories", run_id=run_id)
    probe_top = q("probe_top_tokens", run_id=run_id, limit=20)

    with tempfile.TemporaryDirectory(prefix="rlvr-report-") as tmp:
        figs = Path(tmp) / "figures"
        figs.mkdir()
        fig_curves = plot_training_curves(curves, firings, figs / "training_curves.png")
        fig_passk = plot_passk(passk, figs / "passk_curves.png")
        fig_diff = plot_diff(diff, figs / "per_problem_diff.png")
        fig_probe = plot_probe(probe_trajectory, probe_categories, figs / "probe.png")
        changes: dict[str, int] = {}
        for r in diff:
            changes[r["change"]] = changes.get(r["change"], 0) + 1
        title = f"Run {run_id}"
        sections = [
            f"<h1>{html.escape(title)}</h1>",
            f"<p>Experiment <code>{html.escape(run['experiment'])}</code> · kind {html.escape(str(run['kind']))} · "
            f"status {html.escape(str(run['status']))} · report written "
            f"{dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} from the warehouse.</p>",
            "<h2>Run</h2>", _table(overview, ["run_id", "name", "started_at", "duration_s", "config_hash", "git_sha",
                                              "model_id", "prompt_template", "tags", "artifact_uri", "mlflow_run_id"]),
            "<h2>Evaluation</h2>", _table(metrics, ["benchmark", "checkpoint", "metric", "value", "ci_low", "ci_high", "n"]),
            "<h2>Training curves</h2>", _figure(fig_curves, "training curves with guard firings"),
            "<h3>Guard firings</h3>", _table(firings, ["step", "last_step", "n_steps", "guard_id", "serious", "reason", "source"]),
            "<h2>pass@k</h2>", _figure(fig_passk, "pass@k curves"),
            f"<h2>Per-problem change{' (' + html.escape(diff[0]['checkpoint_a']) + ' → ' + html.escape(diff[0]['checkpoint_b']) + ')' if diff else ''}</h2>",
            _figure(fig_diff, "per-problem sampled solve rate before vs after") if diff else "<p class=empty>Needs a base and a later checkpoint evaluated.</p>",
            _table([{"change": k, "problems": v} for k, v in sorted(changes.items())]) if diff else "",
            "<h2>Checkpoints</h2>", _table(checkpoints, ["checkpoint", "step", "dtype", "zero_stage", "n_parameters",
                                                          "total_bytes", "uri"]),
            "<h2>Probes</h2>", _figure(fig_probe, "probe: KL to the reference over checkpoints and by token category"),
            _table(probe_trajectory, ["probe_id", "checkpoint", "step", "metric", "n_sequences", "mean_kl", "std_kl",
                                      "total_spikes", "mean_dlogp", "turning_points"]) if probe_trajectory else "",
            _table(probe_top, ["probe_id", "checkpoint", "problem_id", "position", "token_text", "category", "kl_sym",
                               "dlogp"]) if probe_top else "",
        ]
        # The icon link stops browsers asking the server for /favicon.ico (a 404 in the console otherwise).
        page = ("<!doctype html><html lang=en><head><meta charset=utf-8>"
                f"<title>{html.escape(title)}</title><link rel=icon href=\"data:,\"><style>{_CSS}</style></head>"
                "<body>" + "\n".join(sections) + "</body></html>\n")
        (Path(tmp) / "index.html").write_text(page)
        prefix = join(folder, REPORT_DIR)
        # Figures first, the page last: a reader that finds index.html finds what it links.
        for f in sorted(figs.iterdir()):
            store.put_file(join(prefix, "figures", f.name), f)
        store.put_file(join(prefix, "index.html"), Path(tmp) / "index.html")

    write_run_index(store, folder)  # the run's own page now lists the report
    return store.url(join(prefix, "index.html"))
