"""PyTorch helpers for stage trainables (``ray_stagetree.trainables.torch``).

Stages stop and resume training at iteration boundaries, and a resumed stage
must produce exactly what an uninterrupted run would (DESIGN invariant 4). Three
things make that work with PyTorch:

* `apply_hparams` pushes changed optimizer hyper-parameters (learning rate,
  momentum, betas, ...) into an optimizer's param groups.
* `ResumableSampler` yields a data order that depends only on ``(seed, epoch)``
  and remembers how far into the epoch it got.
* `ResumableLoader` batches a map-style dataset over that order, counts only
  the batches it actually handed out, and can change its batch size at a stage
  boundary (the data pipeline of the TreeML thesis, section 5.1).

Together with ``model.state_dict()``, ``optimizer.state_dict()`` and
`ray_stagetree.execution.rng.capture_rng_state` they make a complete checkpoint.

The optimizer helpers live in `ray_stagetree.trainables.optimizers` and are
importable from here; the sampler, the loader and its batch iterator share
one cursor invariant and are read together.

Example: one logical training iteration is one epoch
----------------------------------------------------

::

    class MyTrainable(StageTrainable):
        def setup(self, config):
            self.model = build_model(config)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
            self.loader = ResumableLoader(train_set, batch_size=32, seed=config["seed"])
        def update_hparams(self, changed):
            apply_hparams(self.optimizer, changed)            # lr, momentum, ...
            if "batch_size" in changed:
                self.loader.set_batch_size(changed["batch_size"])
        def step(self):
            for x, y in self.loader:                         # the rest of this epoch
                self.optimizer.zero_grad()
                loss_fn(self.model(x), y).backward()
                self.optimizer.step()
            return {"loss": evaluate(self.model)}
        def get_state(self):
            return {"model": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "loader": self.loader.state_dict(),
                    "rng": capture_rng_state()}
        def set_state(self, state):
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.loader.load_state_dict(state["loader"])
            restore_rng_state(state["rng"])


For a logical iteration of N batches instead of one epoch, use
``for x, y in self.loader.take(N)``; epochs roll over inside it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.distributed
from torch.utils.data import DataLoader, IterableDataset, Sampler

from ray_stagetree.execution.scaling import shard

# The optimizer helpers are `optimizers`'; this module is where users import them from.
from ray_stagetree.trainables.optimizers import OPTIMIZER_HPARAMS, apply_hparams, follow_optimizer_hparams

__all__ = ["OPTIMIZER_HPARAMS", "apply_hparams", "follow_optimizer_hparams", "ResumableSampler", "ResumableLoader"]

# --------------------------------------------------------------------------- #
# Data order
# --------------------------------------------------------------------------- #


def _replicas(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """``(num_replicas, rank)``, defaulting to torch.distributed's group."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if num_replicas is None:
        num_replicas = torch.distributed.get_world_size() if distributed else 1
    if rank is None:
        rank = torch.distributed.get_rank() if distributed else 0
    num_replicas = _check_int("num_replicas", num_replicas, 1)
    rank = _check_int("rank", rank, 0)
    if rank >= num_replicas:
        raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank}")
    return num_replicas, rank


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


class ResumableSampler(Sampler[int]):
    """Indices of one epoch in an order that depends only on ``(seed, epoch)``,
    resumable mid-epoch.

    The permutation of epoch ``e`` is ``numpy.random.default_rng((seed,
    e)).permutation(n)`` (``range(n)`` when ``shuffle=False``); global random
    state (``torch.manual_seed``, ``np.random.seed``) never affects it.

    Iterating yields the *rest* of the current epoch, starting at `position`.
    An index counts as consumed when it is yielded; after the last index of an
    epoch, `epoch` goes up by one and `position` is back to 0, so the next
    ``iter()`` is the whole next epoch.

    Parameters
    ----------
    data_source_len:
        Number of samples, ``len(dataset)``.
    seed:
        Non-negative int; trials that must see the same data order share it.
    shuffle:
        ``False`` yields ``0, 1, ..., n-1`` every epoch.

    Notes
    -----
    Use one iterator at a time: a new ``iter()`` or `load_state_dict`
    invalidates earlier iterators (they raise ``RuntimeError``). Given to a
    ``DataLoader`` with ``num_workers > 0`` the loader prefetches indices, so
    `position` runs ahead of the batches actually used; `ResumableLoader`
    does not have that problem.

    Examples
    --------
    >>> sampler = ResumableSampler(5, seed=0)
    >>> it = iter(sampler); first_two = [next(it), next(it)]
    >>> state = sampler.state_dict()
    >>> state["epoch"], state["position"]
    (0, 2)
    >>> resumed = ResumableSampler(5, seed=0)
    >>> resumed.load_state_dict(state)
    >>> first_two + list(resumed) == list(ResumableSampler(5, seed=0))
    True
    >>> resumed.epoch, resumed.position
    (1, 0)
    """

    def __init__(self, data_source_len: int, seed: int, shuffle: bool = True) -> None:
        self._len = _check_int("data_source_len", data_source_len, 0)
        self.seed = _check_int("seed", seed, 0)
        if not isinstance(shuffle, bool):
            raise ValueError(f"shuffle must be True or False, got {shuffle!r}")
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._token = 0  # bumped to invalidate live iterators
        self._cache: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        """Indices left in the current epoch (what ``iter()`` yields)."""
        return self._len - self.position

    @property
    def data_source_len(self) -> int:
        return self._len

    def permutation(self, epoch: int) -> np.ndarray:
        """The full index order of ``epoch`` (read-only int64 array)."""
        perm = self._cache.get(epoch)
        if perm is None:
            if self.shuffle:
                perm = np.random.default_rng((self.seed, epoch)).permutation(self._len)
            else:
                perm = np.arange(self._len)
            perm = perm.astype(np.int64)
            perm.flags.writeable = False
            if len(self._cache) >= 4:  # the current epoch and a look-ahead are enough
                self._cache.clear()
            self._cache[epoch] = perm
        return perm

    def __iter__(self) -> Iterator[int]:
        self._token += 1
        return self._iterate(self._token)

    def _iterate(self, token: int) -> Iterator[int]:
        epoch = self.epoch
        while True:
            if token != self._token:
                raise RuntimeError(
                    "this ResumableSampler iterator is stale: the sampler was iterated again "
                    "or its state was loaded since it was created"
                )
            if self.epoch != epoch or not self._len:
                return
            index = int(self.permutation(epoch)[self.position])
            self._set_cursor(*self._advance(epoch, self.position, 1))
            yield index

    def _advance(self, epoch: int, position: int, count: int) -> tuple[int, int]:
        """Cursor after consuming ``count`` indices, rolling over at the epoch end."""
        position += count
        if position >= self._len:
            return epoch + 1, 0
        return epoch, position

    def _set_cursor(self, epoch: int, position: int) -> None:
        self.epoch, self.position = epoch, position

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "position", "seed", "shuffle", "data_source_len"}``, all
        plain Python ints / bools."""
        return {
            "epoch": int(self.epoch),
            "position": int(self.position),
            "seed": int(self.seed),
            "shuffle": bool(self.shuffle),
            "data_source_len": int(self._len),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a `state_dict` (seed and shuffle included).

        Raises
        ------
        ValueError
            If a key is missing, a value is out of range, or the state was
            made for a dataset of a different length.
        """
        missing = {"epoch", "position", "seed", "shuffle"} - set(state)
        if missing:
            raise ValueError(f"sampler state is missing {sorted(missing)}; got keys {sorted(state)}")
        n = state.get("data_source_len", self._len)
        if n != self._len:
            raise ValueError(
                f"sampler state has data_source_len={n}, but this sampler has {self._len} samples; "
                "a data order cannot be resumed on a dataset of a different length"
            )
        epoch = _check_int("state['epoch']", state["epoch"], 0)
        position = _check_int("state['position']", state["position"], 0)
        if self._len and position >= self._len:
            raise ValueError(f"state['position'] must be in [0, {self._len}), got {position}")
        seed = _check_int("state['seed']", state["seed"], 0)
        if not isinstance(state["shuffle"], bool):
            raise ValueError(f"state['shuffle'] must be True or False, got {state['shuffle']!r}")
        if (seed, state["shuffle"]) != (self.seed, self.shuffle):
            self._cache.clear()
        self.seed, self.shuffle = seed, state["shuffle"]
        self._set_cursor(epoch, position)
        self._token += 1


# --------------------------------------------------------------------------- #
# Batches
# --------------------------------------------------------------------------- #

_RESERVED_LOADER_KWARGS = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "generator")


class _PlannedBatches:
    """The ``batch_sampler`` of one internal DataLoader: an endless stream of
    batch indices from a start cursor. Each batch handed to the DataLoader is
    also queued with the cursor *after* it, so the loader can advance its real
    state when (and only when) the batch reaches the user, however far the
    DataLoader prefetches."""

    def __init__(self, loader: ResumableLoader, epoch: int, position: int) -> None:
        self.loader = loader
        self.start = (epoch, position)
        self.pending: deque[tuple[int, int]] = deque()

    def __iter__(self) -> Iterator[list[int]]:
        loader, sampler = self.loader, self.loader.sampler
        batch_size = loader.batch_size
        epoch, position = self.start
        while True:
            perm = sampler.permutation(epoch)
            indices = perm[position : position + batch_size].tolist()
            epoch, position = loader._normalized(*sampler._advance(epoch, position, len(indices)))
            self.pending.append((epoch, position))
            yield shard(indices, loader.rank, loader.num_replicas)


class ResumableLoader:
    """Batches over a map-style dataset in a resumable, re-batchable order.

    Parameters
    ----------
    dataset:
        A map-style dataset (``__len__`` and ``__getitem__``), e.g. a
        ``TensorDataset``.
    batch_size:
        Samples per batch (int >= 1); change it later with `set_batch_size`.
    seed:
        Seed of the data order (see `ResumableSampler`).
    shuffle:
        Shuffle each epoch (by ``(seed, epoch)``); ``False`` keeps dataset order.
    drop_last:
        Drop the tail of an epoch that is shorter than the batch size.
    num_replicas, rank:
        Data-parallel training: ``batch_size`` is the global batch, and rank
        ``rank`` of ``num_replicas`` gets every ``num_replicas``-th sample of
        it (the split ``DistributedSampler`` makes), so the ranks together
        see exactly the samples one loader of ``batch_size`` would. The
        state (epoch, position, batch size) is global, equal on every rank:
        resuming and `set_batch_size` work as without sharding. An epoch's
        tail with fewer samples than ranks is dropped (a rank would get an
        empty batch). Default: ``torch.distributed``'s world size and rank
        when it is initialised (a data-parallel stage's ranks), else 1 and 0.
    **dataloader_kwargs:
        Passed to the internal ``torch.utils.data.DataLoader``
        (``num_workers``, ``collate_fn``, ``pin_memory``, ...); default
        ``num_workers=0``. ``batch_size``, ``shuffle``, ``sampler``,
        ``batch_sampler``, ``drop_last`` and ``generator`` are set by the
        loader and may not be given.

    API
    ---
    * ``for batch in loader`` (same as `iter_epoch`): the batches of the
      **rest of the current epoch**; the next loop is the next epoch.
    * `take` ``(n)``: the next ``n`` batches, rolling over epoch ends.
    * `next_batch`: one batch, rolling over epoch ends.
    * `epoch`, `position` (samples of this epoch consumed), `batch_size`.
    * `set_batch_size`, `state_dict`, `load_state_dict`.

    Guarantees
    ----------
    * Only batches handed to the caller advance the state, even with
      ``num_workers > 0`` prefetching ahead.
    * K batches, ``state_dict()``, a fresh loader with ``load_state_dict()``,
      then M batches gives exactly the batches K+1..K+M of an uninterrupted
      run, across epoch ends and batch-size changes.
    * The order never depends on global random state, and iterating does not
      draw from torch's global generator (a plain ``DataLoader`` does: each
      ``iter()`` draws a worker base seed from it).

    Notes
    -----
    With ``num_workers > 0``, random transforms inside the dataset run in the
    workers, seeded per internal DataLoader (which is recreated after
    `set_batch_size` / `load_state_dict`); such randomness is not resume-exact.
    With ``num_workers=0`` it uses the main process' generators, which
    `ray_stagetree.execution.rng.capture_rng_state` covers.

    Examples
    --------
    >>> data = torch.utils.data.TensorDataset(torch.arange(10.0))
    >>> loader = ResumableLoader(data, batch_size=4, seed=0, shuffle=False)
    >>> [b[0].tolist() for b in loader]                    # epoch 0
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
    >>> loader.epoch, loader.position
    (1, 0)
    >>> loader.next_batch()[0].tolist(), loader.state_dict()["position"]
    ([0.0, 1.0, 2.0, 3.0], 4)
    >>> loader.set_batch_size(3)                          # stage boundary
    >>> [b[0].tolist() for b in loader.take(3)]           # rolls over into epoch 2
    [[4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [0.0, 1.0, 2.0]]
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = False,
        num_replicas: int | None = None,
        rank: int | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
            raise ValueError(f"dataset must be map-style (__len__ and __getitem__), got {type(dataset).__name__}")
        reserved = sorted(set(dataloader_kwargs) & set(_RESERVED_LOADER_KWARGS))
        if reserved:
            raise ValueError(
                f"ResumableLoader sets {reserved} itself; dataloader_kwargs may hold other "
                "DataLoader arguments (num_workers, collate_fn, pin_memory, ...)"
            )
        if dataloader_kwargs.get("in_order") is False:
            raise ValueError("in_order=False would hand out batches out of order; leave it True")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last must be True or False, got {drop_last!r}")
        self.dataset = dataset
        self.sampler = ResumableSampler(len(dataset), seed, shuffle)
        if len(dataset) == 0:
            raise ValueError("dataset is empty; ResumableLoader needs at least one sample")
        self.drop_last = drop_last
        self.num_replicas, self.rank = _replicas(num_replicas, rank)
        self._batch_size = self._check_batch_size(batch_size)
        self._dataloader_kwargs = dataloader_kwargs
        self._plan: _PlannedBatches | None = None
        self._stream: Iterator[Any] | None = None

    # -- state ------------------------------------------------------------ #

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def epoch(self) -> int:
        """The current epoch (0-based)."""
        return self.sampler.epoch

    @property
    def position(self) -> int:
        """Samples of the current epoch already handed out (or dropped)."""
        return self.sampler.position

    def __len__(self) -> int:
        """Batches left in the current epoch (what ``for batch in loader`` yields)."""
        left = len(self.sampler)
        return left // self._batch_size if self.drop_last else -(-left // self._batch_size)

    def set_batch_size(self, batch_size: int) -> None:
        """Use ``batch_size`` from the next batch on.

        The next batch starts at the current `position`; batches the internal
        DataLoader prefetched with the old size are discarded (they were not
        counted). With ``drop_last`` a tail of the epoch now shorter than the
        batch size is dropped at once, so `epoch` may advance.
        """
        batch_size = self._check_batch_size(batch_size)
        if batch_size != self._batch_size:
            self._batch_size = batch_size
            self._flush()
            self.sampler._set_cursor(*self._normalized(self.sampler.epoch, self.sampler.position))

    def state_dict(self) -> dict[str, Any]:
        """The sampler state plus ``batch_size`` and ``drop_last``; plain Python
        values only, so it fits any checkpoint format."""
        return {**self.sampler.state_dict(), "batch_size": int(self._batch_size), "drop_last": bool(self.drop_last)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a `state_dict`: position, data order (seed, shuffle), batch
        size and drop_last. Call `set_batch_size` afterwards to change the
        batch size for the new stage."""
        if "batch_size" not in state:
            raise ValueError(f"loader state is missing 'batch_size'; got keys {sorted(state)}")
        drop_last = state.get("drop_last", self.drop_last)
        if not isinstance(drop_last, bool):
            raise ValueError(f"state['drop_last'] must be True or False, got {drop_last!r}")
        batch_size = self._check_batch_size(state["batch_size"], drop_last)
        self.sampler.load_state_dict(state)
        self._batch_size, self.drop_last = batch_size, drop_last
        self._flush()
        self.sampler._set_cursor(*self._normalized(self.sampler.epoch, self.sampler.position))

    # -- iteration -------------------------------------------------------- #

    def next_batch(self) -> Any:
        """The next batch, rolling over into the next epoch at an epoch end."""
        if self._stream is None:
            epoch, position = self.sampler.epoch, self.sampler.position
            self._plan = _PlannedBatches(self, epoch, position)
            # Own generator: DataLoader iterators otherwise draw their worker
            # base seed from torch's global RNG, shifting the user's random stream.
            generator = torch.Generator().manual_seed(
                int(np.random.SeedSequence((self.sampler.seed, epoch, position)).generate_state(1)[0])
            )
            dataloader = DataLoader(
                self.dataset, batch_sampler=self._plan, generator=generator, **self._dataloader_kwargs
            )
            self._stream = iter(dataloader)
        try:
            batch = next(self._stream)
        except BaseException:
            self._flush()  # the stream may have queued work past this batch
            raise
        assert self._plan is not None
        self.sampler._set_cursor(*self._plan.pending.popleft())
        return batch

    def iter_epoch(self) -> Iterator[Any]:
        """The batches of the rest of the current epoch (all of it at position 0)."""
        epoch = self.sampler.epoch
        while self.sampler.epoch == epoch:
            yield self.next_batch()

    __iter__ = iter_epoch

    def take(self, num_batches: int) -> Iterator[Any]:
        """The next ``num_batches`` batches, rolling over epoch ends."""
        num_batches = _check_int("num_batches", num_batches, 0)
        for _ in range(num_batches):
            yield self.next_batch()

    # -- internals -------------------------------------------------------- #

    def _check_batch_size(self, batch_size: Any, drop_last: bool | None = None) -> int:
        batch_size = _check_int("batch_size", batch_size, 1)
        if batch_size < self.num_replicas:
            raise ValueError(
                f"batch_size={batch_size} is the global batch of {self.num_replicas} ranks, each taking a share: "
                f"give a batch_size >= {self.num_replicas}"
            )
        if (self.drop_last if drop_last is None else drop_last) and batch_size > self.sampler.data_source_len:
            raise ValueError(
                f"batch_size={batch_size} with drop_last=True exceeds the dataset length "
                f"{self.sampler.data_source_len}; every batch would be dropped"
            )
        return batch_size

    def _normalized(self, epoch: int, position: int) -> tuple[int, int]:
        """With drop_last, skip an epoch tail shorter than the batch size;
        sharded, one shorter than the number of ranks."""
        left = self.sampler.data_source_len - position
        if (self.drop_last and left < self._batch_size) or left < self.num_replicas:
            return epoch + 1, 0
        return epoch, position

    def _flush(self) -> None:
        """Discard the internal DataLoader and everything it prefetched."""
        self._stream = None
        self._plan = None
