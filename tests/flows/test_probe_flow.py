"""The `probe` flow on a real (temporary) Prefect API: each analysis runs `rlvr probe` in its own process,
publishes its folder into the artifact store, and a bad request fails before any work."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from tests.probe.conftest import perturbed, small_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from rlvr_core.data.synthetic import SyntheticSpec, make_synthetic_dataset
    from rlvr_core.data.templates import get_template
    from rlvr_core.tiny.tokenizer import train_tokenizer

    rows = make_synthetic_dataset(SyntheticSpec(n_train=300, n_test=40))
    t = get_template("qa")
    tok = train_tokenizer([t.render(r["question"]) + " " + r["answer"] for r in rows["train"]], vocab_size=400)
    a = small_model(tok, seed=0)
    root = tmp_path_factory.mktemp("probe-flow-models")
    for name, m in (("base", a), ("rl", perturbed(a, 0.02, seed=1))):
        m.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root / "base", root / "rl"


def test_probe_flow_runs_each_analysis_and_publishes(prefect_api, rlvr_home, checkpoints, tmp_path):
    from flows.probe import probe_flow
    from rlvr_core.artifacts.storage import open_store

    base, rl = checkpoints
    small = {"max_problems": 6, "max_new_tokens": 12}
    with pytest.raises(ValueError, match="unknown analyses"):
        probe_flow(str(base), [str(rl)], analyses=["reprot"])
    out = probe_flow(str(base), [f"rl={rl}"], analyses=["report", "boundary"],
                     options={"report": {**small, "selection": "all"},
                              "boundary": {**small, "n_samples": 4}},
                     publish_prefix="probe-exp/run1", work_dir=str(tmp_path / "work"))
    assert out["ingested"] is None  # published under a prefix that is not a run folder
    store = open_store()
    for analysis in ("report", "boundary"):
        local = sorted(p.relative_to(tmp_path / "work" / analysis).as_posix()
                       for p in (tmp_path / "work" / analysis).rglob("*") if p.is_file())
        assert local, analysis
        published = sorted(k.removeprefix(f"probe-exp/run1/probes/{analysis}/")
                           for k in store.list(f"probe-exp/run1/probes/{analysis}"))
        assert published == local, analysis
    # The RL-Probe tables are real: one token row per scored response token of the 6 problems.
    tokens = pq.read_table(tmp_path / "work" / "report" / "probe_tokens.parquet")
    assert tokens.num_rows > 0 and 0 < len(set(tokens.column("problem_id").to_pylist())) <= 6
    assert min(tokens.column("kl_ba").to_pylist()) >= 0.0
