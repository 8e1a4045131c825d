"""The rlvr dashboard: Streamlit over the DuckDB warehouse, read-only.

    rlvr dashboard                      # or: streamlit run dashboards/app.py
    RLVR_WAREHOUSE=/path/w.duckdb rlvr dashboard --port 8502

Every view runs a canned query from dashboards/queries/*.sql through rlvr_core.records.warehouse_queries, the
same SQL the tests check and the static report (`rlvr report RUN`) uses. Each query opens the
warehouse read-only and closes it again, so `rlvr warehouse ingest` can take the writer lock between
two page loads; while an ingest holds it, the page says so instead of failing.
"""

from __future__ import annotations

import altair as alt
import duckdb
import pandas as pd
import streamlit as st

from rlvr_core.core import settings
from rlvr_core.records import warehouse_queries as wq

st.set_page_config(page_title="rlvr · results warehouse", layout="wide")
DB = settings.warehouse_path()


@st.cache_data(ttl=30, show_spinner=False)
def q(name: str, **params) -> pd.DataFrame:
    """A canned query as a DataFrame; cached 30 s so widget changes do not re-read unchanged views."""
    return wq.frame(name, params, DB)


def safe(name: str, **params) -> pd.DataFrame:
    try:
        return q(name, **params)
    except FileNotFoundError as e:
        st.error(str(e))
        st.stop()
    except duckdb.IOException as e:  # a writer holds the file (ingest in progress)
        st.warning(f"The warehouse is being written right now; reload in a moment. ({e})")
        st.stop()


def firing_rules(firings: pd.DataFrame) -> alt.Chart:
    """Vertical rules at guard firings: red where the guard stopped the run, orange for a flag."""
    f = firings.assign(kind=firings["serious"].map({True: "stopped the run", False: "flag"}).fillna("flag (step flag)"))
    return alt.Chart(f).mark_rule(strokeDash=[4, 3], strokeWidth=1.5).encode(
        x="step:Q",
        color=alt.Color("kind:N", scale=alt.Scale(domain=["stopped the run", "flag", "flag (step flag)"],
                                                  range=["#d62728", "#ff7f0e", "#ffbb78"]), title="guard firing"),
        tooltip=["run_id", "step", "guard_id", "reason"])


st.title("rlvr · results warehouse")
st.caption(f"Warehouse: `{DB}` (read-only). Every view is a query in `dashboards/queries/`.")

board = safe("leaderboard")
if board.empty:
    st.info("The warehouse holds no runs yet: run `rlvr demo`, or `rlvr warehouse rebuild` to read the artifact store.")
    st.stop()
run_ids = board["run_id"].tolist()
catalog = safe("catalog")
eval_metrics = catalog.loc[catalog["kind"] == "eval", "name"].tolist() or ["accuracy_greedy"]
train_metrics = catalog.loc[catalog["kind"] == "train", "name"].tolist()

tabs = st.tabs(["Leaderboard", "Training curves", "pass@k", "Ablation", "Per-problem diff", "Probes"])

with tabs[0]:
    metric = st.selectbox("metric", eval_metrics, key="lb_metric")
    board = safe("leaderboard", metric=metric)
    # Runs are ranked only against runs evaluated with the same settings (the query's settings_group:
    # `rlvr compare`'s rule), so the page shows one group at a time, the largest first.
    scored = board[board["settings_group"].notna()]
    groups = list(dict.fromkeys(scored["settings_group"]))

    def describe(g: str) -> str:
        r = scored[scored["settings_group"] == g].iloc[0]
        parts = [str(r["benchmark"])] + [f"{k} {r[c]}" for k, c in (
            ("problems", "n_problems"), ("samples", "samples_per_problem"), ("template", "template"),
            ("T", "temperature"), ("max tokens", "max_new_tokens")) if pd.notna(r[c])]
        return f"{' · '.join(parts)} ({int(r['runs_in_group'])} runs, settings {g})"

    n_collapsed = int(board.drop_duplicates("run_id")["collapsed"].sum())
    st.markdown(f"**{board['run_id'].nunique()} runs** in {board['experiment'].nunique()} experiment(s) · "
                f"{len(groups)} group(s) of comparable evaluation settings · {n_collapsed} collapsed")
    if groups:
        group = st.selectbox("evaluation settings", groups, format_func=describe, key="lb_group")
        ranked = scored[scored["settings_group"] == group]
        top = ranked.iloc[0]
        st.markdown(f"best `{top['run_id']}` with {metric} **{top['value']:.3f}** on {top['benchmark']} "
                    f"({top['checkpoint']}, n={top['n']}), among {len(ranked)} runs evaluated the same way")
        st.dataframe(ranked, hide_index=True, width="stretch")
    unscored = board[board["settings_group"].isna()]
    if not unscored.empty:
        st.caption(f"{len(unscored)} run(s) without {metric}: " + ", ".join(unscored["run_id"]))
    st.subheader("Best checkpoint per benchmark")
    st.dataframe(safe("best_checkpoint", metric=metric), hide_index=True, width="stretch")
    collapsed = safe("collapsed_runs")
    if not collapsed.empty:
        st.subheader("Collapsed runs")
        st.dataframe(collapsed, hide_index=True, width="stretch")

with tabs[1]:
    trained = [r for r in run_ids if r in set(safe("training_curves", runs=run_ids, metrics=None)["run_id"])]
    chosen = st.multiselect("runs", trained, default=trained[:2], key="tc_runs")
    plain = [m for m in train_metrics if "/" not in m]
    metrics = st.multiselect("metrics", train_metrics, default=[m for m in ("reward_mean", "entropy", "kl_ref_mean",
                                                                             "grad_norm") if m in plain] or plain[:4],
                             key="tc_metrics")
    if chosen and metrics:
        curves = safe("training_curves", runs=chosen, metrics=metrics)
        firings = safe("guard_firings", runs=chosen)
        cols = st.columns(2)
        for i, m in enumerate(metrics):
            line = alt.Chart(curves[curves["metric"] == m]).mark_line().encode(
                x="step:Q", y=alt.Y("value:Q", title=m), color=alt.Color("run_id:N", title="run"),
                tooltip=["run_id", "step", "value"])
            chart = alt.layer(line, firing_rules(firings)).resolve_scale(color="independent") if len(firings) else line
            cols[i % 2].altair_chart(chart.properties(title=m, height=230), width="stretch")
        st.subheader("Guard firings")
        st.dataframe(firings, hide_index=True, width="stretch")
    else:
        st.info("No training steps in the warehouse for these runs.")

with tabs[2]:
    passk = safe("passk_curves", runs=None)
    chosen = st.multiselect("runs", sorted(passk["run_id"].unique()), default=sorted(passk["run_id"].unique())[:3],
                            key="pk_runs")
    sel = passk[passk["run_id"].isin(chosen)].assign(curve=lambda d: d["run_id"] + " · " + d["source"])
    if sel.empty:
        st.info("No pass@k curves for these runs.")
    else:
        st.altair_chart(alt.Chart(sel).mark_line(point=True).encode(
            x=alt.X("k:Q", scale=alt.Scale(type="log", base=2)), y=alt.Y("value:Q", title="pass@k",
                                                                          scale=alt.Scale(domain=[0, 1])),
            color="curve:N", tooltip=["run_id", "source", "k", "value", "n_problems"]).properties(height=360),
            width="stretch")
        st.dataframe(sel.drop(columns="curve"), hide_index=True, width="stretch")

with tabs[3]:
    sweeps = safe("sweeps")
    c1, c2, c3, c4 = st.columns(4)
    experiment = c1.selectbox("experiment", sorted(board["experiment"].unique()), key="ab_exp")
    in_exp = sweeps.loc[sweeps["experiment"] == experiment, "sweep"].tolist()
    sweep = c2.selectbox("sweep", in_exp + ["(every run of the experiment)"], key="ab_sweep")
    sweep = None if sweep not in in_exp else sweep
    ab_metric = c3.selectbox("metric", eval_metrics, key="ab_metric")
    checkpoint = c4.text_input("checkpoint (empty: each trial's last non-base)", "", key="ab_ckpt") or None
    pivot = safe("ablation_pivot", experiment=experiment, sweep=sweep, metric=ab_metric, checkpoint=checkpoint)
    if pivot.empty:
        st.info("No evaluated trials in this experiment.")
    else:
        swept = pivot["swept_params"].iloc[0] or "none (one configuration)"
        st.markdown(f"Swept params: **{swept}** · mean over seeds with a 95% Student-t interval "
                    "(a configuration with one run: that run's Wilson interval over problems)")
        cells = pivot.assign(cell=pivot.apply(
            lambda r: f"{r['mean']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] n={r['n_seeds']}"
            if pd.notna(r["ci_low"]) else f"{r['mean']:.3f} n={r['n_seeds']}", axis=1))
        st.dataframe(cells.pivot(index="config", columns="benchmark", values="cell"), width="stretch")
        base = alt.Chart(pivot).encode(y=alt.Y("config:N", title=None), color="benchmark:N")
        st.altair_chart(alt.layer(base.mark_rule().encode(x=alt.X("ci_low:Q", title=ab_metric), x2="ci_high:Q"),
                                  base.mark_point(filled=True, size=70).encode(
                                      x="mean:Q", tooltip=["config", "benchmark", "mean", "ci_low", "ci_high", "n_seeds"]))
                        .facet(row="benchmark:N"), width="stretch")
        st.dataframe(pivot, hide_index=True, width="stretch")

with tabs[4]:
    c1, c2, c3, c4 = st.columns(4)
    run_a = c1.selectbox("run A", run_ids, index=0, key="d_a")
    run_b = c2.selectbox("run B", run_ids, index=min(1, len(run_ids) - 1), key="d_b")
    ck_a = c3.text_input("checkpoint A (empty: last non-base)", "", key="d_cka") or None
    ck_b = c4.text_input("checkpoint B (empty: last non-base)", "", key="d_ckb") or None
    only = st.checkbox("only problems whose greedy outcome changed", key="d_only")
    diff = safe("per_problem_diff", run_a=run_a, run_b=run_b, checkpoint_a=ck_a, checkpoint_b=ck_b, only_changed=only)
    if diff.empty:
        st.info("No evaluated problems in common.")
    else:
        counts = diff["change"].value_counts()
        st.markdown(" · ".join(f"**{k}** {v}" for k, v in counts.items()))
        st.altair_chart(alt.Chart(diff).mark_circle(size=60, opacity=0.7).encode(
            x=alt.X("sampled_a:Q", title=f"sampled solve rate, {run_a}"),
            y=alt.Y("sampled_b:Q", title=f"sampled solve rate, {run_b}"), color="change:N",
            tooltip=["benchmark", "problem_id", "greedy_a", "greedy_b", "sampled_a", "sampled_b"]).properties(height=340),
            width="stretch")
        st.dataframe(diff, hide_index=True, width="stretch")

with tabs[5]:
    trajectory = safe("probe_checkpoints", run_id=None, probe_id=None)
    if trajectory.empty:
        st.info("No probe results in the warehouse yet (rlvr_core.probe writes them; docs/warehouse.md lists the files).")
    else:
        probe_run = st.selectbox("run", sorted(trajectory["run_id"].unique()), key="pr_run")
        traj = trajectory[trajectory["run_id"] == probe_run]
        st.markdown(f"**{traj['probe_id'].nunique()} probe(s)** over {len(traj)} checkpoint(s) of `{probe_run}` · "
                    f"KL to the reference per token ({traj['metric'].iloc[0]})")
        line = alt.Chart(traj).encode(x=alt.X("step:Q", title="training step"), color="probe_id:N")
        chart = (line.mark_area(opacity=0.15).encode(y=alt.Y("lo:Q", title="mean KL per sequence (± sd)"), y2="hi:Q")
                 .transform_calculate(lo="datum.mean_kl - datum.std_kl", hi="datum.mean_kl + datum.std_kl")
                 + line.mark_line(point=True).encode(y="mean_kl:Q", tooltip=list(traj.columns)))
        st.altair_chart(chart.properties(height=260), width="stretch")
        cats = safe("probe_categories", run_id=probe_run, probe_id=None)
        if not cats.empty:
            st.altair_chart(alt.Chart(cats).mark_bar().encode(
                x=alt.X("mean_kl:Q", title="mean KL per token"), y=alt.Y("category:N", title=None),
                yOffset="checkpoint:N", color="checkpoint:N", tooltip=list(cats.columns)).properties(height=320),
                width="stretch")
        st.dataframe(traj, hide_index=True, width="stretch")
        st.subheader("Tokens where a checkpoint disagrees most with the reference")
        st.dataframe(safe("probe_top_tokens", run_id=probe_run, probe_id=None, checkpoint=None, limit=50),
                     hide_index=True, width="stretch")
