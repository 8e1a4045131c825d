"""The staleness acceptance rule of `vllm-server` rollouts (`split_stale`): pure, over hand-made Samples."""

from __future__ import annotations

import pytest

from rlvr_core.experiment.guards import GuardError
from rlvr_core.grpo.server_rollout import split_stale
from rlvr_core.sampling.base import Sample


def _group(pid: str, *versions):
    return [Sample(prompt_id=pid, sample_index=i, text="", token_ids=[1], finish_reason="stop", logprobs=[0.0],
                   seed=i, weight_version=v) for i, v in enumerate(versions)]


def test_groups_inside_the_window_are_accepted_and_a_group_with_one_old_sample_is_stale():
    groups = [_group("a", 3, 3), _group("b", 2, 3), _group("c", 4, 4), _group("d", 1, 1)]
    # window 3 .. 4: "b" has one sample of version 2 (the whole group goes), "d" is all old
    assert split_stale(groups, 3, 4) == ([0, 2], [1, 3])
    assert split_stale(groups, 1, 4) == ([0, 1, 2, 3], [])


@pytest.mark.parametrize("bad", [5, None], ids=["newer-than-pushed", "unlabelled"])
def test_a_version_never_pushed_is_a_weight_push_guard_error(bad):
    groups = [_group("a", 4, 4), _group("b", 4, bad)]
    with pytest.raises(GuardError, match=r"G-weight-push: 1 samples carry a weight version never pushed "
                                         rf"\(e.g. 'b'/1 by version {bad}; newest pushed 4\)"):
        split_stale(groups, 3, 4)
