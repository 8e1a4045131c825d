"""The nightly evaluation's report (flows/nightly_eval.py): every checkpoint evaluated for a suite, with the numbers
a reader needs to trust a difference, as Markdown and as a self-contained HTML page.

Per checkpoint (in the order they were exported): greedy accuracy with n and its 95 % Wilson interval, pass@k
(unbiased estimator, k = 1, 2, 4, ... up to the samples per problem), and B − A deltas with the paired t interval
on per-problem differences (`rlvr_core.eval.compare`) against the checkpoint before it and against the base model
(evaluated by the same suite). A pair whose settings differ is not compared: the report says which setting
(G-eval-parallel). Links per checkpoint (the training run, the evaluation's MLflow run, the evaluation's folder in
the artifact store, the checkpoint) are given by the flow; relative ones (into the store) work wherever the store
is browsed, like the index pages (`rlvr_core.artifacts.artifacts_index`).

Pure: no Prefect, no store access; the flow reads the tables and hands them in (`Evaluated`).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from rlvr_core.core.passk import default_ks, pass_at_k
from rlvr_core.core.stats import wilson_interval
from rlvr_core.eval.compare import EvalSource, SettingsMismatch, compare

__all__ = ["Evaluated", "checkpoint_numbers", "paired_delta", "build_report", "to_markdown", "to_html"]


@dataclass
class Evaluated:
    """One evaluation in the report: the base model or a checkpoint."""

    name: str                       # what the report calls it (the checkpoint's key, or "base")
    source: EvalSource              # its samples and settings (`compare.from_tables`)
    links: dict[str, str] = field(default_factory=dict)  # label -> href, in the order shown
    new: bool = False               # evaluated by this flow run
    trained_with: str | None = None  # the prompt template it was trained with (None: unknown)
    template_mismatch: bool = False  # G-prompt-mismatch: trained on another template than the suite's


def checkpoint_numbers(src: EvalSource) -> dict[str, Any]:
    """Greedy accuracy with n and 95 % Wilson interval, and pass@k of the headline scoring, over the problems of
    the evaluation's (first) benchmark."""
    bench = src.benchmarks[0]
    greedy: dict[str, bool] = {}
    correct: dict[str, int] = {}
    drawn: dict[str, int] = {}
    for r in src.records:
        if r["benchmark"] != bench:
            continue
        ok = r["status"] == "correct"
        if r["greedy"]:
            greedy[r["problem_id"]] = ok
        else:
            correct[r["problem_id"]] = correct.get(r["problem_id"], 0) + ok
            drawn[r["problem_id"]] = drawn.get(r["problem_id"], 0) + 1
    n, hits = len(greedy), sum(greedy.values())
    lo, hi = wilson_interval(hits, n)
    passk: dict[int, float] = {}
    ns = set(drawn.values())
    if len(ns) == 1 and (m := ns.pop()) > 0:
        passk = {k: sum(float(pass_at_k(m, correct[p], k)) for p in drawn) / len(drawn) for k in default_ks(m)}
    return {"benchmark": bench, "accuracy": hits / n if n else float("nan"), "n": n, "ci_low": lo, "ci_high": hi,
            "passk": passk}


def paired_delta(a: EvalSource, b: EvalSource) -> dict[str, Any]:
    """B − A greedy accuracy (and pass@1) on the problems both scored, with the paired 95 % t interval; or
    {"refused": why} when their settings differ or they share no problem."""
    try:
        res = compare(a, b)
    except (SettingsMismatch, ValueError) as e:
        return {"refused": str(e).splitlines()[0] + "".join(
            "; " + line.strip() for line in str(e).splitlines()[1:4] if line.startswith("  "))}
    block = next(iter(res["benchmarks"].values()))["deltas"]
    acc = block.get("accuracy_greedy")
    if acc is None:
        return {"refused": "no greedy completions on both sides"}
    out = {k: acc[k] for k in ("delta", "ci_low", "ci_high", "n")}
    if "pass@1" in block:
        out["pass@1"] = {k: block["pass@1"][k] for k in ("delta", "ci_low", "ci_high")}
    return out


def build_report(suite: str, checkpoints: list[Evaluated], base: Evaluated | None, *, n_in_store: int,
                 header_links: dict[str, str] | None = None, pending: list[str] = ()) -> dict[str, Any]:
    """The report's content: `checkpoints` in export order, each with its numbers and deltas."""
    rows, prev = [], None
    for c in checkpoints:
        rows.append({"name": c.name, "new": c.new, "links": c.links, "trained_with": c.trained_with,
                     "template_mismatch": c.template_mismatch, **checkpoint_numbers(c.source),
                     "vs_previous": paired_delta(prev.source, c.source) | {"against": prev.name} if prev else None,
                     "vs_base": paired_delta(base.source, c.source) if base else None})
        prev = c
    return {"suite": suite, "n_in_store": n_in_store, "rows": rows, "pending": list(pending),
            "base": ({"name": base.name, "links": base.links, **checkpoint_numbers(base.source)} if base else None),
            "header_links": header_links or {},
            "ci_method": "accuracy: Wilson 95 % interval; deltas: paired t interval on per-problem differences "
                         "(95 %), B − A"}


def _pct(v: float | None) -> str:
    return "–" if v is None or v != v else f"{100 * v:.1f}"


def _acc(r: dict) -> str:
    return f"{_pct(r['accuracy'])} [{_pct(r['ci_low'])}, {_pct(r['ci_high'])}] (n = {r['n']})"


def _delta(d: dict | None) -> str:
    if d is None:
        return "–"
    if "refused" in d:
        return f"not compared: {d['refused']}"
    ci = f"[{_pct(d['ci_low'])}, {_pct(d['ci_high'])}]" if d["ci_low"] is not None else "[no interval]"
    return f"{100 * d['delta']:+.1f} {ci} (n = {d['n']})"


def _passk(r: dict) -> str:
    return ", ".join(f"@{k} {_pct(v)}" for k, v in r["passk"].items()) or "–"


def _trained_with(r: dict) -> str:
    t = r.get("trained_with")
    return "unknown" if t is None else f"`{t}`" + (" ⚠ template mismatch" if r.get("template_mismatch") else "")


MISMATCH_NOTE = ("**G-prompt-mismatch**: a checkpoint marked ⚠ was trained on another prompt template than this "
                 "suite's; its score may understate what it learned.")


def to_markdown(rep: dict[str, Any]) -> str:
    lines = [f"# Nightly evaluation — suite `{rep['suite']}`", "",
             f"{rep['n_in_store']} checkpoints in the store; {sum(r['new'] for r in rep['rows'])} evaluated in this run"
             f" (★); all {len(rep['rows'])} evaluated for this suite are below, in export order. Numbers in points; "
             f"{rep['ci_method']}.", ""]
    lines += [f"[{label}]({href})" for label, href in rep["header_links"].items()]
    if rep["pending"]:
        lines += ["", f"{len(rep['pending'])} being evaluated by another run."]
    b = rep["base"]
    base_links = "".join(f" · [{label}]({href})" for label, href in b["links"].items()) if b else ""
    lines += ["", f"Base model: greedy accuracy {_acc(b)}; pass {_passk(b)}{base_links}" if b
              else "No base-model evaluation.", ""]
    lines += ["| checkpoint | greedy accuracy [95 %] | pass@k | Δ vs previous [95 %] | Δ vs base [95 %] | trained with "
              "| links |", "|---|---|---|---|---|---|---|"]
    for r in rep["rows"]:
        links = " · ".join(f"[{label}]({href})" for label, href in r["links"].items())
        lines.append(f"| {'★ ' if r['new'] else ''}`{r['name']}` | {_acc(r)} | {_passk(r)} | "
                     f"{_delta(r['vs_previous'])} | {_delta(r['vs_base'])} | {_trained_with(r)} | {links} |")
    if any(r["template_mismatch"] for r in rep["rows"]):
        lines += ["", MISMATCH_NOTE]
    return "\n".join(lines) + "\n"


def _a(href: str, label: str) -> str:
    return f'<a href="{html.escape(href, quote=True)}">{html.escape(label)}</a>'


def _td(cls: str, text: str) -> str:
    return f'<td class="{cls}">{html.escape(text)}</td>'


def to_html(rep: dict[str, Any]) -> str:
    """A self-contained page; every number cell has a class (accuracy, passk, delta-previous, delta-base) and
    each row `data-checkpoint`, so a reader (or a test) finds them."""
    b = rep["base"]
    rows = []
    for r in rep["rows"]:
        links = " · ".join(_a(href, label) for label, href in r["links"].items())
        rows.append(f'<tr data-checkpoint="{html.escape(r["name"], quote=True)}">'
                    f'<td class="name">{"★ " if r["new"] else ""}<code>{html.escape(r["name"])}</code></td>'
                    + _td("accuracy", _acc(r)) + _td("passk", _passk(r)) + _td("delta-previous", _delta(r["vs_previous"]))
                    + _td("delta-base", _delta(r["vs_base"])) + _td("trained-with", _trained_with(r).replace("`", ""))
                    + f'<td class="links">{links}</td></tr>')
    header = " · ".join(_a(href, label) for label, href in rep["header_links"].items())
    base = (f'<p class="base">Base model: greedy accuracy {html.escape(_acc(b))}; pass {html.escape(_passk(b))}'
            + "".join(" · " + _a(href, label) for label, href in b["links"].items()) + "</p>"
            if b else "<p>No base-model evaluation.</p>")
    pending = f"<p>{len(rep['pending'])} being evaluated by another run.</p>" if rep["pending"] else ""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Nightly evaluation {html.escape(rep['suite'])}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:4px 8px;vertical-align:top}}th{{background:#f4f4f4}}</style></head><body>
<h1>Nightly evaluation — suite <code>{html.escape(rep['suite'])}</code></h1>
<p>{rep['n_in_store']} checkpoints in the store; {sum(r['new'] for r in rep['rows'])} evaluated in this run (★); all
{len(rep['rows'])} evaluated for this suite, in export order. Numbers in points; {html.escape(rep['ci_method'])}.</p>
<p>{header}</p>{pending}{base}
<table><tr><th>checkpoint</th><th>greedy accuracy [95 %]</th><th>pass@k</th><th>Δ vs previous [95 %]</th>
<th>Δ vs base [95 %]</th><th>trained with</th><th>links</th></tr>
{chr(10).join(rows)}
</table>{"<p>" + html.escape(MISMATCH_NOTE.replace("**", "")) + "</p>" if any(r["template_mismatch"] for r in rep["rows"]) else ""}
</body></html>
"""
