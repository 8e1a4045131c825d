"""Matplotlib figures for the probe reports (Agg backend: files only, no display needed).

Each function takes the probe tables (or plain arrays) and a path, writes one PNG and returns the path.
matplotlib is imported inside the functions so that importing the probe package stays light.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

__all__ = ["kl_distribution", "spike_analysis", "category_breakdown", "sample_sequences", "histograms_by_source",
           "passk_curves", "accuracy_histogram", "replacement_curves", "extrapolation_curve"]


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def _labels(ck: dict) -> list[str]:
    return [c if s is None or str(s) in c else f"{c}\n(step {s})" for c, s in zip(ck["checkpoint"], ck["step"])]


def kl_distribution(checkpoints: pa.Table, tokens: pa.Table, metric: str, path: Path) -> Path:
    """Left: mean per-problem KL by checkpoint (± std over problems). Right: per-token KL of the last checkpoint."""
    plt = _plt()
    ck = checkpoints.to_pydict()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(ck["checkpoint"]))
    ax1.errorbar(x, ck["mean_kl"], yerr=ck["std_kl"], marker="o", capsize=3)
    ax1.set_xticks(x, _labels(ck), fontsize=8)
    ax1.set_ylabel(f"mean {metric} per problem")
    ax1.set_title("Mean KL by checkpoint (± std over problems)")
    last = ck["checkpoint"][-1] if ck["checkpoint"] else None
    t = tokens.to_pydict()
    vals = np.asarray([v for c, v in zip(t["checkpoint_b"], _metric(t, metric)) if c == last])
    if vals.size:
        ax2.hist(vals, bins=60, log=True, color="tab:blue")
    ax2.set_xlabel(f"per-token {metric}")
    ax2.set_ylabel("tokens (log)")
    ax2.set_title(f"Per-token KL distribution ({last})")
    return _save(fig, path)


def _metric(t: dict, metric: str) -> list[float]:
    return [abs(v) for v in t["dlogp"]] if metric == "dlogp_abs" else t[metric]


def spike_analysis(checkpoints: pa.Table, problems: pa.Table, path: Path) -> Path:
    """Left: mean spikes per problem by checkpoint. Right: spikes-per-problem histogram of the last checkpoint."""
    plt = _plt()
    ck = checkpoints.to_pydict()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(ck["checkpoint"]))
    ax1.bar(x, ck["mean_spikes"], color="tab:orange")
    ax1.set_xticks(x, _labels(ck), fontsize=8)
    ax1.set_ylabel("mean spikes per problem")
    ax1.set_title("Spikes by checkpoint")
    last = ck["checkpoint"][-1] if ck["checkpoint"] else None
    p = problems.to_pydict()
    n = [s for c, s in zip(p["checkpoint"], p["n_spikes"]) if c == last]
    if n:
        ax2.hist(n, bins=np.arange(0, max(n) + 2) - 0.5, color="tab:orange")
    ax2.set_xlabel("spikes in the response")
    ax2.set_ylabel("problems")
    ax2.set_title(f"Spikes per problem ({last})")
    return _save(fig, path)


def category_breakdown(categories: pa.Table, checkpoint: str, path: Path) -> Path:
    """Mean KL, token count and spike rate by token category for one checkpoint."""
    plt = _plt()
    c = categories.to_pydict()
    rows = [(cat, kl, n, r) for ck, cat, kl, n, r in zip(c["checkpoint"], c["category"], c["mean_kl"], c["n_tokens"],
                                                         c["spike_rate"]) if ck == checkpoint]
    rows.sort(key=lambda r: -r[1])
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    names = [r[0] for r in rows]
    for ax, j, title, color in ((axes[0], 1, "mean KL", "tab:blue"), (axes[1], 2, "tokens", "tab:gray"),
                                (axes[2], 3, "spike rate (spikes / tokens)", "tab:red")):
        ax.barh(names, [r[j] for r in rows], color=color)
        ax.invert_yaxis()
        ax.set_title(f"{title} by category")
    fig.suptitle(checkpoint)
    return _save(fig, path)


def sample_sequences(tokens: pa.Table, checkpoint: str, sequence_ids: list[str], metric: str, path: Path) -> Path:
    """Per-token KL along a few responses, spikes marked red and labelled with their token."""
    plt = _plt()
    t = tokens.to_pydict()
    vals = _metric(t, metric)
    k = max(1, len(sequence_ids))
    fig, axes = plt.subplots(k, 1, figsize=(12, 2.4 * k), squeeze=False)
    for ax, sid in zip(axes[:, 0], sequence_ids):
        idx = [i for i, (c, s) in enumerate(zip(t["checkpoint_b"], t["sequence_id"])) if c == checkpoint and s == sid]
        y = np.asarray([vals[i] for i in idx])
        ax.plot(np.arange(len(y)), y, lw=1)
        for j, i in enumerate(idx):
            if t["is_spike"][i]:
                ax.plot(j, y[j], "o", color="red", ms=4)
                ax.annotate(repr(t["token_text"][i])[1:-1], (j, y[j]), fontsize=7, xytext=(2, 3),
                            textcoords="offset points")
        ax.set_title(f"{sid} ({checkpoint})", fontsize=9)
        ax.set_ylabel(metric)
    axes[-1, 0].set_xlabel("response token position")
    return _save(fig, path)


def histograms_by_source(values: dict[str, dict[str, np.ndarray]], path: Path, *, bins: int = 60) -> Path:
    """One panel per metric: histograms (log counts) of the metric for tokens sampled from each model.

    values: {metric: {source label: (n,) array}}.
    """
    plt = _plt()
    metrics = list(values)
    cols = min(3, len(metrics))
    rows = (len(metrics) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.5 * rows), squeeze=False)
    for ax, m in zip(axes.ravel(), metrics):
        allv = np.concatenate([v for v in values[m].values() if len(v)]) if values[m] else np.zeros(0)
        if allv.size:
            edges = np.linspace(float(allv.min()), float(allv.max()) + 1e-12, bins + 1)
            for label, v in values[m].items():
                ax.hist(v, bins=edges, log=True, histtype="step", lw=1.5, label=label)
        ax.set_title(m)
        ax.legend(fontsize=8)
    for ax in axes.ravel()[len(metrics):]:
        ax.axis("off")
    return _save(fig, path)


def passk_curves(curves: dict[str, dict[int, float]], path: Path) -> Path:
    """pass@k against k (log2 axis), one line per model."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, c in curves.items():
        ks = sorted(c)
        ax.plot(ks, [c[k] for k in ks], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k")
    ax.set_title("Capability boundary: pass@k")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, path)


def accuracy_histogram(rates: dict[str, np.ndarray], edges: np.ndarray, path: Path) -> Path:
    """Per-problem accuracy (fraction of correct samples) histograms, side by side per model."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = list(rates)
    width = 0.8 / max(1, len(labels))
    centers = np.arange(len(edges) - 1)
    for j, lab in enumerate(labels):
        counts, _ = np.histogram(rates[lab], bins=edges)
        ax.bar(centers + j * width, counts, width=width, label=lab)
    ax.set_xticks(centers + 0.4 - width / 2, [f"{edges[i]:.1f}-{edges[i + 1]:.1f}" for i in range(len(edges) - 1)],
                  fontsize=7, rotation=45)
    ax.set_xlabel("per-problem accuracy")
    ax.set_ylabel("problems")
    ax.set_title("Accuracy distribution")
    ax.legend()
    return _save(fig, path)


def replacement_curves(rows: list[dict], reference_acc: dict[str, float], path: Path) -> Path:
    """Accuracy against realised replacement rate, one line per selection criterion."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for crit in sorted({r["criterion"] for r in rows}):
        pts = sorted((r["replace_rate"], r["accuracy"]) for r in rows if r["criterion"] == crit)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=crit)
    for (label, acc), style in zip(reference_acc.items(), ("--", ":", "-.")):
        ax.axhline(acc, ls=style, lw=1, color="gray", label=f"{label} alone")
    ax.set_xlabel("replaced tokens (share)")
    ax.set_ylabel("accuracy")
    ax.set_title("Selective token replacement (A's samples, B's tokens)")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _save(fig, path)


def extrapolation_curve(rows: list[dict], path: Path) -> Path:
    """Accuracy against γ, one line per variant (global / selective)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for var in sorted({r["variant"] for r in rows}):
        pts = sorted((r["gamma"], r["accuracy"]) for r in rows if r["variant"] == var)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=var)
    ax.set_xlabel("γ")
    ax.set_ylabel("accuracy")
    ax.set_title("Test-time extrapolation: log p_B + γ Δlog p")
    ax.legend(fontsize=8)
    return _save(fig, path)
