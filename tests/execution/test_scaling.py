"""The worker-group arithmetic of data-parallel stages (no Ray)."""

import pytest

from ray_stagetree.execution.scaling import Scaling, groups_that_fit, shard


def _scaling(num_workers, strategy="PACK", **per_worker):
    return Scaling.of(num_workers, per_worker or {"CPU": 1}, placement_strategy=strategy)


@pytest.mark.parametrize(
    "nodes, scaling, groups",
    [
        # 2 CPUs, ranks of 0.75: two ranks fit, so one group of two (per rank: two "workers")
        ([{"CPU": 2}], _scaling(2, CPU=0.75), 1),
        ([{"CPU": 2}], _scaling(2, CPU=0.5), 2),
        ([{"CPU": 1}], _scaling(3, CPU=1 / 3), 1),  # fractions that sum to a whole fit
        # 4-GPU nodes, 3 GPUs per group: PACK spreads the spare GPUs over groups, STRICT_PACK cannot
        ([{"GPU": 4, "CPU": 16}] * 2, _scaling(3, GPU=1), 2),
        ([{"GPU": 4, "CPU": 16}] * 2, _scaling(3, "STRICT_PACK", GPU=1), 2),
        ([{"GPU": 4, "CPU": 16}] * 3, _scaling(3, "PACK", GPU=1), 4),
        ([{"GPU": 4, "CPU": 16}] * 3, _scaling(3, "STRICT_PACK", GPU=1), 3),
        # STRICT_SPREAD: each rank on its own node
        ([{"GPU": 4}] * 2, _scaling(3, "STRICT_SPREAD", GPU=1), 0),
        ([{"GPU": 1}, {"GPU": 2}, {"GPU": 3}], _scaling(2, "STRICT_SPREAD", GPU=1), 3),
        ([{"CPU": 8}], _scaling(2, GPU=1), 0),  # a node without the resource holds none
    ],
)
def test_groups_that_fit_never_count_a_group_the_nodes_cannot_place_whole(nodes, scaling, groups):
    assert groups_that_fit(nodes, scaling) == groups


def test_a_scaling_is_part_of_what_trials_share():
    assert _scaling(2).key() != _scaling(4).key()
    assert _scaling(2, CPU=0.5).key() != _scaling(2, CPU=1).key()
    assert _scaling(2).key() == Scaling.of(2, {"CPU": 1.0, "GPU": 0}).key()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_workers": 0, "per_worker": {"CPU": 1}}, "num_workers"),
        ({"num_workers": 2, "per_worker": {}}, "must ask for some resource"),
        ({"num_workers": 2, "per_worker": {"CPU": 1}, "placement_strategy": "TIGHT"}, "placement_strategy"),
    ],
)
def test_bad_scalings_are_refused_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Scaling.of(**kwargs)


def test_the_ranks_shares_are_the_global_batch_each_sample_once():
    batch = list(range(10, 17))
    shares = [shard(batch, rank, 3) for rank in range(3)]
    assert sorted(i for share in shares for i in share) == batch
    assert shares[0] == [10, 13, 16]
