"""Browsing the artifact store: index pages of runs and sweeps, and the local view `rlvr artifacts open` shows.

Every run folder (`<experiment>/<run name>-<id>/` or `<experiment>/<sweep>/<trial>/`, rlvr_core.artifacts.layout,
docs/artifacts.md) gets an `index.html` at its root listing its reports and files with *relative* links, so
the page works wherever the folder is: opened from a laptop's store, from a copy downloaded out of S3, or
from a static web server in front of the bucket. Its figures (training reward, pass@k) are inline SVG, so
the page shows them even when it is opened alone. A sweep folder gets one too (`write_sweep_index`): the
pivot with its intervals, a figure, and a link to each trial's page. Pages are browsing aids derived from
the folder, rewritten whenever a stage adds files, and never read by the pipeline.
"""

from __future__ import annotations

import html
import io
import json
import math
import posixpath
import re
import time
from pathlib import Path
from urllib.parse import quote, unquote

from rlvr_core.artifacts.export import MANIFEST_FILE
from rlvr_core.artifacts.layout import RUN_FILE, find_run_folders, sweep_prefix
from rlvr_core.artifacts.storage import ArtifactStore, LocalStore, S3Store, join, open_store
from rlvr_core.core import settings, svgplot

INDEX = "index.html"
_LINKS_MARK = "rlvr-links: "
# Folders of a run, in the order the page shows them; anything else follows alphabetically.
SECTIONS = ("reports", "evals", "passk", "curriculum", "train", "probes", "checkpoints")
_RUN_FIELDS = ("experiment", "name", "kind", "status", "started_at", "finished_at", "duration_s", "config_hash",
               "git_sha", "model_id", "dataset_hash", "mlflow_run_id", "prefect_flow_run_id")


def human_size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _fmt(v) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def decimals(n: int | None) -> int:
    """Decimals for a fraction of `n` (an accuracy over n problems, or a mean over n problem-seeds): enough that
    two neighbouring values k/n and (k+1)/n never print alike (0.025 and 0.050 from n = 40), and at least 3."""
    return max(3, math.ceil(math.log10(n))) if n and n > 1 else 3


def _num(v, d: int) -> str:
    return "–" if v is None else f"{v:.{d}f}"


def _link(rel: str, text: str | None = None) -> str:
    return f'<a href="{html.escape(quote(rel))}">{html.escape(text or rel)}</a>'


_STYLE = ("<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}td,th{padding:0 1em 0 0;text-align:left}"
          "td.n{text-align:right;color:#555}h2{margin-top:1.5em}svg{margin:.5em 1em .5em 0}</style>")


def render_index(run_prefix: str, sizes: dict[str, int], run: dict | None = None,
                 links: dict[str, str] | None = None, figures: list[str] | None = None) -> str:
    """The index page of one run folder. `sizes` maps keys *relative to the run folder* to bytes;
    `figures` are inline SVG elements (shown whether or not the files beside the page are there)."""
    files = {k: v for k, v in sizes.items() if k != INDEX}
    groups: dict[str, list[str]] = {}
    for rel in sorted(files):
        groups.setdefault(rel.split("/", 1)[0] if "/" in rel else "", []).append(rel)
    order = [""] + [s for s in SECTIONS if s in groups] + sorted(g for g in groups if g and g not in SECTIONS)
    reports = [r for r in groups.get("reports", []) if r.endswith((".html", ".md", ".pdf", ".png", ".svg"))]
    title = html.escape(f"rlvr run {run_prefix}")
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>",
           f"<link rel=icon href='data:,'>{_STYLE}</head><body>", f"<h1>{title}</h1>"]
    if run:
        out.append("<table>" + "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(_fmt(run[k]))}</td></tr>"
                                       for k in _RUN_FIELDS if run.get(k) not in (None, "")) + "</table>")
    if links:
        out.append("<p>" + " · ".join(f'<a href="{html.escape(u)}">{html.escape(name)}</a>'
                                      for name, u in links.items()) + "</p>")
        # Kept for the next rewrite; '-' escaped so the JSON never holds a comment's "--".
        out.append(f"<!-- {_LINKS_MARK}" + json.dumps(links).replace("-", "\\u002d") + " -->")
    if figures:
        out.append("<h2>Figures</h2>" + "".join(figures))
    if reports:
        out.append("<h2>Reports</h2><ul>" + "".join(f"<li>{_link(r)}</li>" for r in reports) + "</ul>")
    for g in order:
        out.append(f"<h2>{html.escape(g + '/') if g else 'Files'}</h2><table>")
        out += [f"<tr><td>{_link(rel)}</td><td class='n'>{human_size(files[rel])}</td></tr>" for rel in groups[g]]
        out.append("</table>")
    out.append(f"<p><small>{len(files)} files, {human_size(sum(files.values()))}; written "
               f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC</small></p></body></html>\n")
    return "\n".join(out)


def _previous_links(store: ArtifactStore, base: str) -> dict[str, str] | None:
    """The links the folder's current index.html was written with (kept when a later stage rewrites it)."""
    try:
        page = store.get_text(join(base, INDEX))
    except (OSError, ValueError):
        return None
    m = re.search(rf"<!-- {_LINKS_MARK}(.*?) -->", page)
    try:
        return json.loads(m.group(1)) if m else None
    except ValueError:
        return None


def write_run_index(store: ArtifactStore, run_prefix: str, links: dict[str, str] | None = None) -> str:
    """(Re)write `<run_prefix>/index.html` from what the store holds now; returns its key. Without `links`,
    the links of the page it replaces are kept (a report written later does not drop the MLflow link)."""
    base = run_prefix.strip("/")
    sizes = {k[len(base) + 1:]: n for k, n in store.sizes(base).items()}
    if not sizes:
        raise FileNotFoundError(f"no run folder {base!r} in {store.uri}")
    if links is None and INDEX in sizes:
        links = _previous_links(store, base)
    run = None
    if "run.json" in sizes:
        try:
            run = json.loads(store.get_text(join(base, "run.json")))
        except (ValueError, OSError):
            run = None  # an index without the header beats no index
    return store.put_text(join(base, INDEX), render_index(base, sizes, run, links, run_figures(store, base, sizes)))


def _parquet(store: ArtifactStore, key: str, columns: list[str] | None = None) -> list[dict]:
    import pyarrow.parquet as pq

    data = pq.read_table(io.BytesIO(store.get_bytes(key)))
    return data.select([c for c in columns if c in data.column_names] if columns else data.column_names).to_pylist()


def run_figures(store: ArtifactStore, base: str, sizes: dict[str, int]) -> list[str]:
    """Inline SVG of the run's training reward and pass@k curves, from its own Parquet files (when present)."""
    figs = []
    try:
        if "train/steps.parquet" in sizes:
            rows = _parquet(store, join(base, "train/steps.parquet"), ["step", "reward_mean"])
            series = {"reward_mean": [(r["step"], r.get("reward_mean")) for r in rows]}
            figs.append(svgplot.line_chart(series, title="training reward (mean per step)", xlabel="step",
                                           ylabel="reward"))
        if "passk_curves.parquet" in sizes:
            rows = _parquet(store, join(base, "passk_curves.parquet"), ["source", "scoring", "k", "value"])
            series: dict[str, list] = {}
            for r in rows:
                name = str(r.get("source")) + (f" ({r['scoring']})" if r.get("scoring") else "")
                series.setdefault(name, []).append((r["k"], r["value"]))
            figs.append(svgplot.line_chart(dict(list(series.items())[:8]), title="pass@k", xlabel="k",
                                           ylabel="pass@k", log2_x=True, y_range=(0.0, 1.0)))
    except (OSError, ValueError, KeyError, TypeError):
        pass  # a page without a figure beats no page; the files stay listed below
    return [f for f in figs if f]


def _json_or_none(store: ArtifactStore, key: str) -> dict | None:
    try:
        v = json.loads(store.get_text(key))
        return v if isinstance(v, dict) else None
    except (ValueError, OSError):
        return None


def write_sweep_index(store: ArtifactStore, sweep_prefix: str, *, pivot: list[dict], swept_keys: list[str],
                      metric: str, links: dict[str, str] | None = None) -> str:
    """(Re)write `<sweep_prefix>/index.html` and `pivot.json`: the pivot (one row per cell, mean and 95%
    interval across seeds) as a table and a figure, and every trial folder below with a link to its page."""
    base = sweep_prefix.strip("/")
    store.put_text(join(base, "pivot.json"), json.dumps(pivot, indent=2, default=str))
    trials = []
    for folder in find_run_folders(store, base):
        summary = _json_or_none(store, join(folder, "summary.json")) or {}
        trials.append({"folder": folder[len(base) + 1:], "run": _json_or_none(store, join(folder, RUN_FILE)) or {},
                       "summary": summary, "has_index": store.exists(join(folder, INDEX))})
    return store.put_text(join(base, INDEX), render_sweep_index(base, pivot, swept_keys, metric, trials, links))


def render_sweep_index(base: str, pivot: list[dict], swept_keys: list[str], metric: str, trials: list[dict],
                       links: dict[str, str] | None = None) -> str:
    title = html.escape(f"rlvr sweep {base}")
    by_trial = {t["summary"].get("trial_id"): t for t in trials if t["summary"].get("trial_id")}

    def trial_link(tid: str) -> str:
        t = by_trial.get(tid)
        return _link(t["folder"] + "/" + INDEX, tid) if t and t["has_index"] else html.escape(str(tid))

    n_cell = max([(r.get("n_problems") or 0) * (r.get("n_seeds") or 1) for r in pivot] or [0])
    d = decimals(n_cell)  # means over seeds of accuracies over n problems
    fig = svgplot.interval_chart(
        [(" ".join(f"{k.rsplit('.', 1)[-1]}={r.get(k)}" for k in swept_keys) or "all", r["mean"], r.get("ci_low"),
          r.get("ci_high")) for r in pivot], title=f"{metric}: mean and 95% CI per cell", ylabel=metric, decimals=d)
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>",
           f"<link rel=icon href='data:,'>{_STYLE}</head><body>", f"<h1>{title}</h1>"]
    if links:
        out.append("<p>" + " · ".join(f'<a href="{html.escape(u)}">{html.escape(n)}</a>' for n, u in links.items())
                   + "</p>")
    out.append(f"<h2>Pivot: {html.escape(metric)} by cell</h2>" + fig + "<table><tr>"
               + "".join(f"<th>{html.escape(c)}</th>" for c in [*swept_keys, "seeds", "n problems", "mean", "95% CI",
                                                                  "interval", "per seed", "trials"]) + "</tr>")
    out += [_pivot_row(r, swept_keys, d, trial_link) for r in pivot]
    out.append("</table><p>" + _link("pivot.json") + " (the same rows as JSON)</p><h2>Trials</h2><table>"
               "<tr><th>trial</th><th>what differs</th><th>status</th><th>" + html.escape(metric) + "</th>"
               "<th>95% CI (Wilson)</th><th>n</th></tr>")
    for t in sorted(trials, key=lambda t: t["folder"]):
        out.append(_trial_row(t, metric))
    out.append(f"</table><p><small>{len(trials)} trials; written {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())}"
               " UTC</small></p></body></html>\n")
    return "\n".join(out)


def _pivot_row(r: dict, swept_keys: list[str], d: int, trial_link) -> str:
    """A cell's line: its swept values, seeds, problems per trial, mean and interval to `d` decimals, the
    interval's kind, each seed's value (to the decimals its n needs) and the trials, linked."""
    ci = f"{_num(r.get('ci_low'), d)}–{_num(r.get('ci_high'), d)}" if r.get("ci_low") is not None else "–"
    cells = [*(html.escape(str(r.get(k))) for k in swept_keys), str(r.get("n_seeds")), str(r.get("n_problems", "–")),
             f"{r['mean']:.{d}f}", ci, html.escape(str(r.get("ci_kind", ""))),
             ", ".join(f"{v:.{decimals(r.get('n_problems'))}f}" for v in r.get("per_seed") or []),
             ", ".join(trial_link(t) for t in r.get("trial_ids") or [])]
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def _trial_row(t: dict, metric: str) -> str:
    """A trial's line: its value to the decimals its n needs, its interval and n (the greedy accuracy's, from
    summary.json: `accuracy_greedy_ci95`, `n_eval`; other metrics show their value alone)."""
    s = t["summary"]
    v = s.get(metric)
    n = s.get("n_eval") if metric == "accuracy_greedy" else None
    ci = s.get("accuracy_greedy_ci95") if metric == "accuracy_greedy" else None
    d = decimals(n)
    name = _link(t["folder"] + "/" + INDEX, t["folder"]) if t["has_index"] else html.escape(t["folder"])
    ci_text = f"{_num(ci[0], d)}–{_num(ci[1], d)}" if isinstance(ci, (list, tuple)) and len(ci) == 2 else "–"
    return (f"<tr><td>{name}</td><td>{html.escape(str(s.get('trial_label') or ''))}</td>"
            f"<td>{html.escape(str(t['run'].get('status') or ''))}</td>"
            f"<td class='n'>{_num(v, d) if isinstance(v, (int, float)) else '–'}</td>"
            f"<td class='n'>{ci_text}</td><td class='n'>{n if n is not None else '–'}</td></tr>")


def view_cache(store: ArtifactStore) -> Path:
    """Where `open` puts copies of remote artifacts: `$RLVR_HOME/cache/artifact-views/<bucket>/<prefix>`."""
    if not isinstance(store, S3Store):
        raise TypeError(f"{store.uri}: only remote stores are copied into the view cache")
    return settings.paths().cache / "artifact-views" / store.bucket / store.prefix


class NoIndexError(FileNotFoundError):
    """A folder exists but has no index.html to open."""


def local_view(store: ArtifactStore, key: str, *, is_file: bool, with_checkpoints: bool = False) -> Path:
    """A local path showing `key` (rlvr_core.records.locate finds it): a file, or a folder's index page.

    Local stores answer with the path in place; S3 keys are downloaded to `view_cache` (a folder is
    copied whole, every checkpoints/ folder in it only with `with_checkpoints`, so its index's relative
    links work). A folder without an index.html raises NoIndexError saying how to get one."""
    if not is_file and not store.exists(join(key, INDEX)):
        is_run = bool(key) and store.exists(join(key, RUN_FILE))
        hint = f"write one with: rlvr artifacts index {key}" if is_run else f"list it with: rlvr artifacts ls {key}"
        raise NoIndexError(f"{store.url(key) if key else store.uri}: a folder without {INDEX}; {hint.rstrip()}")
    if isinstance(store, LocalStore):
        path = store.root / key if key else store.root
    else:
        path = view_cache(store) / key
        fetched = {key} if is_file else set()
        if is_file:
            store.get_file(key, path)
        else:
            for k in store.list(key):
                rel = k[len(key) + 1:] if key else k
                if with_checkpoints or not _in_checkpoints(rel):  # a sweep's trials have theirs
                    store.get_file(k, path / rel)
                    fetched.add(k)
        page = key if is_file else join(key, INDEX)
        if page.endswith((".html", ".htm")):
            fetch_linked(store, page, view_cache(store), with_checkpoints=with_checkpoints, fetched=fetched)
    return path if is_file else path / INDEX


LINK_DEPTH = 2  # a page's links are fetched, and the links of the pages among them, not further
CHECKPOINTS_NOTE_ID = "rlvr-checkpoints-note"
_HREF = re.compile(r'\b(?:href|src)="([^"]*)"')
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")


def relative_links(page: str) -> list[str]:
    """The store-relative targets of a page's links (href and src; not `http:`, `data:`, `#…` or `/…`),
    unquoted, without fragment or query."""
    out = []
    for raw in _HREF.findall(page):
        link = html.unescape(raw)
        if not link or link.startswith(("#", "/")) or _SCHEME.match(link):
            continue
        link = unquote(link.split("#", 1)[0].split("?", 1)[0])
        if link:
            out.append(link)
    return out


def _in_checkpoints(key: str) -> bool:
    """A file inside a checkpoints/ folder; its manifest (small, says what the checkpoint holds) is not counted."""
    parts = key.split("/")
    return "checkpoints" in parts[:-1] and parts[-1] != MANIFEST_FILE


def fetch_linked(store: ArtifactStore, page: str, cache: Path, *, with_checkpoints: bool = False,
                 fetched: set[str] | None = None) -> None:
    """Make the relative links of the local copy `cache/page` work: download what they point to (a file; a
    folder's index.html, else its files) to `cache/<key>`, and follow the pages among them `LINK_DEPTH` deep.
    Checkpoint files are downloaded only `with_checkpoints`; a page with links to ones left out gets a note at
    its top saying so, in the local copy only. `fetched`: keys already downloaded by this open (each key is
    downloaded once an open, and again by the next: the copy follows the store)."""
    todo, seen, fetched = [(page, LINK_DEPTH)], {page}, fetched if fetched is not None else {page}
    while todo:
        key, depth = todo.pop()
        local = cache / key
        text = local.read_text(encoding="utf-8", errors="replace")
        left_out = 0
        for rel in relative_links(text):
            target = posixpath.normpath(posixpath.join(posixpath.dirname(key), rel))
            if target == ".." or target.startswith("../"):
                continue  # above the store's prefix: not ours to fetch
            keys, missing = _fetch_target(store, target, cache, with_checkpoints, fetched)
            left_out += missing
            for k in keys:
                if depth > 1 and k.endswith((".html", ".htm")) and k not in seen:
                    seen.add(k)
                    todo.append((k, depth - 1))
        if left_out and CHECKPOINTS_NOTE_ID not in text:
            local.write_text(_with_note(text, left_out, store.url(page)), encoding="utf-8")


def _fetch_target(store: ArtifactStore, target: str, cache: Path, with_checkpoints: bool,
                  fetched: set[str]) -> tuple[list[str], int]:
    """(the keys of `target` now in `cache`, 1 when checkpoint files it needs were left out else 0)."""
    if target in fetched:
        return [target], 0
    if store.exists(target):
        keys = [target]
    else:  # a folder: its page, else its files (a local folder opens as a listing)
        keys = store.list(target)
        if join(target, INDEX) in keys:
            keys = [join(target, INDEX)]
    wanted = [k for k in keys if with_checkpoints or not _in_checkpoints(k)]
    for k in wanted:
        if k not in fetched:
            store.get_file(k, cache / k)
            fetched.add(k)
    return wanted, int(len(wanted) < len(keys))


def _with_note(page: str, n: int, ref: str) -> str:
    note = (f'<p id="{CHECKPOINTS_NOTE_ID}" style="background:#fff3cd;padding:6px 10px">{n} link'
            f'{"s" if n > 1 else ""} on this page point into checkpoints/, which this local copy leaves out; '
            f"to have them: <code>rlvr artifacts open {html.escape(ref)} --with-checkpoints</code></p>")
    at = page.find("<body>")
    return page[:at + 6] + note + page[at + 6:] if at >= 0 else note + page


def publish_sweep_index(config: dict, sweep_id: str, pivot: list[dict], swept_keys: list[str], metric: str,
                        links: dict[str, str] | None = None) -> str:
    """The sweep's index page in the store its trials wrote to (`config`: the sweep's resolved base config,
    whose storage and tracking.experiment the trials share); returns the page's URL."""
    store = open_store(config["storage"]["artifact_uri"], config["storage"].get("s3_endpoint_url"))
    key = write_sweep_index(store, sweep_prefix(config["tracking"]["experiment"], sweep_id), pivot=pivot,
                            swept_keys=swept_keys, metric=metric, links=links)
    return store.url(key)
