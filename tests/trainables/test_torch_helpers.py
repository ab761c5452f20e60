"""PyTorch helpers: optimizer hyper-parameters, resumable data order and
batches, and bit-exact resume of a small training run."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402

from ray_stagetree.execution.rng import capture_rng_state, restore_rng_state, seed_everything  # noqa: E402
from ray_stagetree.trainables.torch import (  # noqa: E402
    ResumableLoader,
    ResumableSampler,
    apply_hparams,
)


def _params():
    return [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]


def _ids(batch) -> list[int]:
    return batch[0].tolist()


def _indices(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


# --------------------------------------------------------------------------- #
# apply_hparams
# --------------------------------------------------------------------------- #


def test_apply_hparams_sgd_sets_every_group_and_ignores_other_keys():
    a, b = _params()
    opt = torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1, momentum=0.0)
    applied = apply_hparams(
        opt, {"optim/lr": 0.01, "momentum": 0.9, "weight_decay": 1e-4, "nesterov": True, "batch_size": 64}
    )
    assert applied == {"optim/lr", "momentum", "weight_decay", "nesterov"}
    for group in opt.param_groups:
        assert group["lr"] == 0.01
        assert group["momentum"] == 0.9
        assert group["weight_decay"] == 1e-4
        assert group["nesterov"] is True
    assert apply_hparams(opt, {"batch_size": 32, "model/dropout": 0.1}) == set()
    # The values travel with the optimizer's checkpoint.
    c, d = _params()
    fresh = torch.optim.SGD([{"params": [c]}, {"params": [d]}], lr=1.0)
    fresh.load_state_dict(opt.state_dict())
    assert [g["lr"] for g in fresh.param_groups] == [0.01, 0.01]


def test_apply_hparams_adam_betas_and_single_beta():
    opt = torch.optim.Adam(_params(), lr=1e-3)
    assert apply_hparams(opt, {"lr": 3e-4, "betas": [0.8, 0.99], "eps": 1e-6}) == {"lr", "betas", "eps"}
    group = opt.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"]) == (3e-4, (0.8, 0.99), 1e-6)
    assert apply_hparams(opt, {"opt/beta2": 0.9}) == {"opt/beta2"}
    assert group["betas"] == (0.8, 0.9)
    assert apply_hparams(opt, {"beta1": 0.5, "beta2": 0.95}) == {"beta1", "beta2"}
    assert group["betas"] == (0.5, 0.95)


def test_apply_hparams_missing_key_names_key_class_and_available_keys():
    opt = torch.optim.Adam(_params(), lr=1e-3)
    with pytest.raises(ValueError) as err:
        apply_hparams(opt, {"lr": 0.1, "momentum": 0.9})
    message = str(err.value)
    assert "'momentum'" in message and "Adam" in message and "betas" in message and "lr" in message
    assert opt.param_groups[0]["lr"] == 1e-3  # validated before anything was set

    sgd = torch.optim.SGD(_params(), lr=0.1)
    with pytest.raises(ValueError, match="SGD has no 'betas'"):
        apply_hparams(sgd, {"beta1": 0.9})


@pytest.mark.parametrize(
    "hparams, match",
    [
        ({"lr": -0.1}, "lr must be >= 0"),
        ({"lr": float("nan")}, "finite real number"),
        ({"lr": "0.1"}, "finite real number"),
        ({"momentum": True}, "finite real number"),
        ({"betas": (0.9,)}, "betas must be a pair"),
        ({"beta1": 1.0}, r"beta1 must be in \[0, 1\)"),
        ({"nesterov": "yes"}, "nesterov must be True or False"),
        ({"lr": 0.1, "optim/lr": 0.2}, "both set 'lr'"),
        ({"betas": (0.9, 0.99), "beta1": 0.9}, "either 'betas' or 'beta1'/'beta2'"),
    ],
)
def test_apply_hparams_rejects_bad_values(hparams, match):
    opt = torch.optim.Adam(_params(), lr=1e-3)
    if "nesterov" in hparams:
        opt = torch.optim.SGD(_params(), lr=1e-3)
    with pytest.raises(ValueError, match=match):
        apply_hparams(opt, hparams)


def test_apply_hparams_same_value_under_two_paths_is_fine():
    opt = torch.optim.SGD(_params(), lr=1.0)
    assert apply_hparams(opt, {"lr": 0.2, "optim/lr": 0.2}) == {"lr", "optim/lr"}
    assert opt.param_groups[0]["lr"] == 0.2


def test_apply_hparams_keeps_tensor_lr_a_tensor():
    opt = torch.optim.Adam(_params(), lr=torch.tensor(1e-3))
    lr = opt.param_groups[0]["lr"]
    apply_hparams(opt, {"lr": 0.5})
    assert opt.param_groups[0]["lr"] is lr and lr.item() == 0.5


# --------------------------------------------------------------------------- #
# ResumableSampler
# --------------------------------------------------------------------------- #


def test_sampler_epochs_are_permutations_that_roll_over():
    sampler = ResumableSampler(10, seed=1)
    epoch0, epoch1 = list(sampler), list(sampler)
    assert sorted(epoch0) == sorted(epoch1) == list(range(10))
    assert epoch0 != epoch1
    assert (sampler.epoch, sampler.position) == (2, 0)
    assert list(ResumableSampler(4, seed=1, shuffle=False)) == [0, 1, 2, 3]
    # (seed, epoch) pairs do not alias the way seed + epoch would.
    assert ResumableSampler(50, seed=0).permutation(1).tolist() != ResumableSampler(50, seed=1).permutation(0).tolist()


def test_sampler_resumes_mid_epoch_and_state_is_plain():
    sampler = ResumableSampler(7, seed=3)
    it = iter(sampler)
    head = [next(it) for _ in range(4)]
    state = sampler.state_dict()
    assert state == {"epoch": 0, "position": 4, "seed": 3, "shuffle": True, "data_source_len": 7}
    assert all(type(v) in (int, bool) for v in state.values())

    resumed = ResumableSampler(7, seed=999, shuffle=False)  # seed and shuffle come from the state
    resumed.load_state_dict(state)
    assert len(resumed) == 3
    assert head + list(resumed) == list(ResumableSampler(7, seed=3))
    assert resumed.permutation(1).tolist() == ResumableSampler(7, seed=3).permutation(1).tolist()


def test_sampler_order_ignores_global_rng():
    orders = []
    for global_seed in (0, 1, 12345):
        torch.manual_seed(global_seed)
        seed_everything(global_seed)
        sampler = ResumableSampler(20, seed=7)
        orders.append([list(sampler) for _ in range(3)])
    assert orders[0] == orders[1] == orders[2]


def test_sampler_errors():
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        ResumableSampler(5, seed=-1)
    with pytest.raises(ValueError, match="data_source_len"):
        ResumableSampler(-5, seed=0)
    sampler = ResumableSampler(5, seed=0)
    with pytest.raises(ValueError, match="data_source_len=6"):
        sampler.load_state_dict(ResumableSampler(6, seed=0).state_dict())
    with pytest.raises(ValueError, match=r"missing \['position'\]"):
        sampler.load_state_dict({"epoch": 0, "seed": 0, "shuffle": True})
    stale = iter(sampler)
    next(stale)
    iter(sampler)
    with pytest.raises(RuntimeError, match="stale"):
        next(stale)


def test_sampler_works_inside_a_plain_dataloader():
    sampler = ResumableSampler(10, seed=2)
    loader = torch.utils.data.DataLoader(_indices(10), batch_size=4, sampler=sampler)
    first = [_ids(b) for b in loader]
    assert sum(first, []) == ResumableSampler(10, seed=2).permutation(0).tolist()
    assert sampler.epoch == 1


# --------------------------------------------------------------------------- #
# ResumableLoader
# --------------------------------------------------------------------------- #


def _run(loader: ResumableLoader, n: int) -> list[list[int]]:
    return [_ids(loader.next_batch()) for _ in range(n)]


def test_loader_epoch_take_and_len():
    loader = ResumableLoader(_indices(10), batch_size=4, seed=0, shuffle=False)
    assert len(loader) == 3
    assert [_ids(b) for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert (loader.epoch, loader.position) == (1, 0)
    assert [_ids(b) for b in loader.take(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(loader) == 1
    assert [_ids(b) for b in loader] == [[8, 9]]  # the rest of epoch 1 only
    assert [_ids(b) for b in loader.take(4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [0, 1, 2, 3]]
    assert loader.epoch == 3


def test_loader_drop_last():
    loader = ResumableLoader(_indices(10), batch_size=4, seed=0, shuffle=False, drop_last=True)
    assert len(loader) == 2
    assert [_ids(b) for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert (loader.epoch, loader.position) == (1, 0)  # the short tail was dropped
    _run(loader, 1)
    loader.set_batch_size(2)  # at position 4 the tail [8, 9] is a full batch now
    assert _run(loader, 4) == [[4, 5], [6, 7], [8, 9], [0, 1]]
    loader.set_batch_size(9)  # tail shorter than 9: dropped at once
    assert (loader.epoch, loader.position) == (3, 0)
    with pytest.raises(ValueError, match="exceeds the dataset length 10"):
        loader.set_batch_size(11)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 23),
    batch_size=st.integers(1, 9),
    new_batch_size=st.integers(1, 9),
    k=st.integers(0, 12),
    m=st.integers(1, 12),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**40),
)
def test_loader_resume_equals_uninterrupted_run(n, batch_size, new_batch_size, k, m, shuffle, drop_last, seed):
    if drop_last and max(batch_size, new_batch_size) > n:
        return
    make = lambda: ResumableLoader(_indices(n), batch_size, seed, shuffle=shuffle, drop_last=drop_last)  # noqa: E731

    # (a) K batches, save, restore into a fresh loader, M batches == K + M batches.
    whole = _run(make(), k + m)
    first = make()
    head = _run(first, k)
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert head + _run(resumed, m) == whole
    assert all(type(v) in (int, bool) for v in first.state_dict().values())

    # Batch-size change at batch K: in place == save, restore, set size.
    straight = make()
    head = _run(straight, k)
    state = straight.state_dict()
    straight.set_batch_size(new_batch_size)
    tail_straight = _run(straight, m)
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_batch_size(new_batch_size)
    assert _run(resumed, m) == tail_straight
    assert resumed.state_dict() == straight.state_dict()
    # Without drop_last every sample of an epoch is used exactly once, whatever the sizes.
    if not drop_last:
        flat = sum(head + tail_straight, [])
        for e in range(len(flat) // n):
            assert sorted(flat[e * n : (e + 1) * n]) == list(range(n))


def test_loader_next_batch_starts_at_position_after_size_change():
    loader = ResumableLoader(_indices(12), batch_size=5, seed=4)
    perm = loader.sampler.permutation(0).tolist()
    assert _run(loader, 1) == [perm[:5]]
    loader.set_batch_size(3)
    assert _run(loader, 3) == [perm[5:8], perm[8:11], perm[11:]]
    assert (loader.epoch, loader.position) == (1, 0)


def test_loader_order_ignores_global_rng_and_does_not_consume_it():
    runs = []
    for global_seed in (0, 99):
        torch.manual_seed(global_seed)
        runs.append(_run(ResumableLoader(_indices(15), batch_size=4, seed=5), 9))
    assert runs[0] == runs[1]

    # A plain DataLoader draws a base seed from torch's global generator on each
    # iter(); ResumableLoader must not shift the user's random stream.
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    loader = ResumableLoader(_indices(15), batch_size=4, seed=5)
    loader.next_batch()
    loader.set_batch_size(2)  # recreates the internal DataLoader
    loader.next_batch()
    assert torch.equal(torch.rand(3), expected)


def test_loader_with_prefetching_workers_counts_only_yielded_batches():
    kwargs = dict(num_workers=2, prefetch_factor=4)
    uninterrupted = _run(ResumableLoader(_indices(30), 4, seed=1), 12)
    loader = ResumableLoader(_indices(30), 4, seed=1, **kwargs)
    head = _run(loader, 5)
    assert (loader.epoch, loader.position) == (0, 20)  # not what the workers prefetched
    state = loader.state_dict()
    resumed = ResumableLoader(_indices(30), 4, seed=1, **kwargs)
    resumed.load_state_dict(state)
    assert head + _run(resumed, 7) == uninterrupted


def test_loader_failed_fetch_does_not_advance():
    class Flaky(torch.utils.data.Dataset):
        fail = True

        def __len__(self):
            return 6

        def __getitem__(self, i):
            if Flaky.fail and i == 3:
                raise OSError("disk hiccup")
            return i

    loader = ResumableLoader(Flaky(), batch_size=2, seed=0, shuffle=False)
    assert loader.next_batch().tolist() == [0, 1]
    with pytest.raises(OSError):
        loader.next_batch()
    assert loader.position == 2
    Flaky.fail = False
    assert loader.next_batch().tolist() == [2, 3]


def test_loader_argument_errors():
    with pytest.raises(ValueError, match=r"sets \['generator', 'sampler'\] itself"):
        ResumableLoader(_indices(4), 2, 0, sampler=None, generator=None)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        ResumableLoader(_indices(4), 0, 0)
    with pytest.raises(ValueError, match="dataset is empty"):
        ResumableLoader(_indices(0), 2, 0)
    loader = ResumableLoader(_indices(4), 2, 0)
    with pytest.raises(ValueError, match="data_source_len=5"):
        loader.load_state_dict(ResumableLoader(_indices(5), 2, 0).state_dict())
    with pytest.raises(ValueError, match="missing 'batch_size'"):
        loader.load_state_dict(loader.sampler.state_dict())


# --------------------------------------------------------------------------- #
# End to end: an interrupted training run resumes bit-exactly
# --------------------------------------------------------------------------- #

# Stage schedule: (batches in the stage, hparams applied at its start).
_STAGES = [
    (7, {"optim/lr": 0.05, "batch_size": 8}),
    (5, {"optim/lr": 0.02, "momentum": 0.5, "batch_size": 16}),  # crosses epoch ends
    (9, {"optim/lr": 0.01, "batch_size": 5}),
]


def _setup():
    seed_everything(0)
    generator = torch.Generator().manual_seed(123)
    x = torch.randn(50, 6, generator=generator)
    y = x @ torch.randn(6, 1, generator=generator) + 0.1 * torch.randn(50, 1, generator=generator)
    # Dropout makes the run depend on torch's global RNG, so the checkpoint must carry it.
    model = torch.nn.Sequential(torch.nn.Dropout(0.2), torch.nn.Linear(6, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = ResumableLoader(TensorDataset(x, y), batch_size=8, seed=7)
    return model, optimizer, loader


def _train_stage(model, optimizer, loader, num_batches, hparams):
    apply_hparams(optimizer, hparams)
    loader.set_batch_size(hparams["batch_size"])
    for xb, yb in loader.take(num_batches):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        optimizer.step()


def _checkpoint(model, optimizer, loader) -> bytes:
    buffer = io.BytesIO()
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "loader": loader.state_dict(),
            "rng": capture_rng_state(),
        },
        buffer,
    )
    return buffer.getvalue()


@pytest.mark.slow  # trains a CNN with DataLoader workers
@pytest.mark.parametrize("interrupt_after", [1, 2])
def test_interrupted_training_resumes_bit_exactly(interrupt_after):
    model, optimizer, loader = _setup()
    for num_batches, hparams in _STAGES:
        _train_stage(model, optimizer, loader, num_batches, hparams)
    uninterrupted = [p.detach().clone() for p in model.parameters()]

    model, optimizer, loader = _setup()
    for num_batches, hparams in _STAGES[:interrupt_after]:
        _train_stage(model, optimizer, loader, num_batches, hparams)
    blob = _checkpoint(model, optimizer, loader)

    # A fresh "worker": different global RNG state, fresh objects, checkpoint loaded.
    model, optimizer, loader = _setup()
    torch.manual_seed(999)
    torch.rand(17)
    state = torch.load(io.BytesIO(blob), weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    loader.load_state_dict(state["loader"])
    restore_rng_state(state["rng"])
    for num_batches, hparams in _STAGES[interrupt_after:]:
        _train_stage(model, optimizer, loader, num_batches, hparams)

    resumed = list(model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted, resumed))
    assert loader.epoch >= 1  # the run crossed epoch boundaries


def test_training_without_rng_restore_diverges():
    """Guards the test above: the dropout run really depends on the RNG state."""
    model, optimizer, loader = _setup()
    for num_batches, hparams in _STAGES:
        _train_stage(model, optimizer, loader, num_batches, hparams)
    uninterrupted = [p.detach().clone() for p in model.parameters()]

    model, optimizer, loader = _setup()
    _train_stage(model, optimizer, loader, *_STAGES[0])
    blob = _checkpoint(model, optimizer, loader)
    model, optimizer, loader = _setup()
    state = torch.load(io.BytesIO(blob), weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    loader.load_state_dict(state["loader"])
    torch.manual_seed(999)  # RNG state not restored
    for num_batches, hparams in _STAGES[1:]:
        _train_stage(model, optimizer, loader, num_batches, hparams)
    assert not all(torch.equal(a, b) for a, b in zip(uninterrupted, model.parameters()))


def test_sharded_loaders_resume_and_rebatch_to_the_samples_of_one_unsharded_loader():
    """Two ranks' loaders of a global batch, saved and resumed mid-epoch and
    re-batched, hand out together exactly what one loader does; an epoch
    tail shorter than the ranks is dropped rather than handed to one rank."""
    data = torch.utils.data.TensorDataset(torch.arange(11))
    one = ResumableLoader(data, batch_size=4, seed=3, num_replicas=1, rank=0)
    ranks = [ResumableLoader(data, batch_size=4, seed=3, num_replicas=2, rank=rank) for rank in (0, 1)]

    def step(count):
        expected = [sorted(b[0].tolist()) for b in one.take(count)]
        got = [[b[0].tolist() for b in loader.take(count)] for loader in ranks]
        assert [sorted(a + b) for a, b in zip(*got)] == expected

    step(2)
    states = [loader.state_dict() for loader in ranks]
    assert states[0] == states[1] == one.state_dict()  # the cursor is global
    ranks = [ResumableLoader(data, batch_size=4, seed=3, num_replicas=2, rank=rank) for rank in (0, 1)]
    for loader, state in zip(ranks, states):
        loader.load_state_dict(state)
    for loader in [one, *ranks]:
        loader.set_batch_size(2)
    step(1)  # the epoch's 11th sample alone: too few for two ranks
    assert ranks[0].epoch == 1 and ranks[0].position == 0
    with pytest.raises(ValueError, match="batch_size=1 is the global batch of 2 ranks"):
        ranks[0].set_batch_size(1)
