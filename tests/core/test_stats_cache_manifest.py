import json
import math

import pytest

from rlvr_core.core.manifest import build_manifest, git_state, rows_sha256
from rlvr_core.core.stats import wilson_interval
from rlvr_core.pipeline.cache import cached_dir, mark_done, resumable_dir


def test_wilson_against_hand_worked_values():
    # Wilson (1927) 95% interval for 8/10, worked by hand from the closed form:
    # centre = (0.8 + z²/20) / (1 + z²/10), half = z·sqrt(0.016 + z²/400) / (1 + z²/10), z = 1.959964
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4901625, abs=1e-6) and hi == pytest.approx(0.9433178, abs=1e-6)
    # 0 successes: lower bound exactly 0, upper z²/(n+z²).
    lo, hi = wilson_interval(0, 30)
    z2 = 1.959963984540054 ** 2
    assert lo == 0.0 and hi == pytest.approx(z2 / (30 + z2), rel=1e-12)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_wilson_covers_at_nominal_rate():
    # Monte Carlo coverage check against the definition: ~95% of intervals contain the true p.
    import random

    rng = random.Random(0)
    p, n, hits = 0.3, 50, 0
    for _ in range(2000):
        k = sum(rng.random() < p for _ in range(n))
        lo, hi = wilson_interval(k, n)
        hits += lo <= p <= hi
    assert 0.93 <= hits / 2000 <= 0.97


def test_cached_dir_builds_once_and_survives_a_crash(tmp_path):
    calls = []

    def build(d):
        calls.append(d)
        (d / "out.txt").write_text("v1")

    f1, hit1 = cached_dir("s", {"a": 1}, build, root=tmp_path)
    f2, hit2 = cached_dir("s", {"a": 1}, build, root=tmp_path)
    assert (hit1, hit2) == (False, True) and f1 == f2 and len(calls) == 1
    assert json.loads((f1 / "cache_key.json").read_text()) == {"a": 1}
    f3, hit3 = cached_dir("s", {"a": 2}, build, root=tmp_path)
    assert not hit3 and f3 != f1

    def crash(d):
        (d / "half.txt").write_text("partial")
        raise RuntimeError("killed mid-build")

    with pytest.raises(RuntimeError):
        cached_dir("s", {"a": 3}, crash, root=tmp_path)
    # Nothing half-built is left where a later run would trust it.
    f4, hit4 = cached_dir("s", {"a": 3}, build, root=tmp_path)
    assert not hit4 and not (f4 / "half.txt").exists() and (f4 / "out.txt").read_text() == "v1"
    assert [p.name for p in (tmp_path / "s").iterdir() if p.name.startswith(".tmp")] == []


def test_hashes(tmp_path):
    assert rows_sha256([{"x": 1, "y": 2}]) == rows_sha256([{"y": 2, "x": 1}]) != rows_sha256([{"x": 2, "y": 2}])


def test_manifest_fields():
    m = build_manifest(config_hash="abc", resolved_config={"k": 1}, datasets={"train": "h"}, seeds={"s": 0},
                       model={"id": "m", "hash": "mh", "tokenizer_hash": "th"}, template="qa@1")
    assert m["config_hash"] == "abc" and m["datasets"] == {"train": "h"} and m["prompt_template"] == "qa@1"
    assert m["packages"]["torch"].startswith("2.") and m["packages"]["duckdb"]
    git = git_state()
    assert set(git) == {"sha", "dirty"}
    if git["sha"] is not None:
        assert len(git["sha"]) == 40 and isinstance(git["dirty"], bool)
    json.dumps(m)  # the manifest is plain JSON
    assert not any(isinstance(v, float) and math.isnan(v) for v in m.values())


def test_resumable_dir_is_stable_until_done(tmp_path):
    folder, done = resumable_dir("train", {"lr": 1}, root=tmp_path)
    assert not done
    (folder / "checkpoint-2").mkdir()  # a run killed after step 2 leaves its checkpoint here
    again, done = resumable_dir("train", {"lr": 1}, root=tmp_path)
    assert again == folder and not done and (again / "checkpoint-2").is_dir()
    mark_done(folder)
    assert resumable_dir("train", {"lr": 1}, root=tmp_path) == (folder, True)
    assert resumable_dir("train", {"lr": 2}, root=tmp_path)[0] != folder
