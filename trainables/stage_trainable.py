"""The class-trainable API: a ``ray.tune.Trainable`` with sequence values."""

from __future__ import annotations

from typing import Any

from ray import tune


class StageTrainable(tune.Trainable):
    """Subclass and implement `setup`, `step`, and either the directory pair
    `save_checkpoint` / `load_checkpoint` or the in-memory pair `get_state` /
    `set_state` (faster: the state goes to the Ray object store without
    touching disk).

    The runtime calls `update_hparams` with every sequence value before the
    first iteration of a stage batch, then with the values that change before
    each iteration where some change. ``config`` holds the sequences
    themselves; read values from `update_hparams` (or `hparams`).

    Examples
    --------
    >>> class MyTrainable(StageTrainable):
    ...     def setup(self, config):
    ...         self.model = build(config)
    ...     def update_hparams(self, changed):
    ...         apply_hparams(self.optimizer, changed)
    ...     def step(self):
    ...         return {"loss": train_one_epoch(self.model)}
    ...     def get_state(self):
    ...         return {"model": self.model.state_dict()}
    ...     def set_state(self, state):
    ...         self.model.load_state_dict(state["model"])

    It is a ``ray.tune.Trainable``, so ``tune.with_resources`` and
    ``tune.with_parameters`` take it, but a light one: the stage worker runs
    it, with no Tune logger or trial folder (``logdir`` is None).
    Plain ``ray.tune.Trainable`` subclasses run unchanged too.
    """

    def __init__(self, config: dict[str, Any] | None = None, storage: Any = None) -> None:
        from ray.tune.trainable.trainable import TRIAL_INFO

        self.config = dict(config or {})
        self._trial_info = self.config.pop(TRIAL_INFO, None)
        self._logdir = None
        self._storage = storage
        self.hparams: dict[str, Any] = {}
        self._iteration = 0
        self.setup(self.config)

    def setup(self, config: dict[str, Any]) -> None:
        """Build the model, data and optimizer (called once per stage batch)."""

    def step(self) -> dict[str, Any]:
        """Train one iteration and return its metrics."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def update_hparams(self, changed: dict[str, Any]) -> None:
        """Apply new sequence values (learning rate, batch size, ...)."""

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any] | None:
        """Write the state to ``checkpoint_dir`` (used when `get_state` returns None)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement get_state()/set_state() or "
            "save_checkpoint()/load_checkpoint() so other trials can fork from it"
        )

    def load_checkpoint(self, checkpoint: str | dict[str, Any]) -> None:
        """Restore what `save_checkpoint` wrote: the directory path, or the
        dict it returned (Tune's two forms)."""
        raise NotImplementedError(f"{type(self).__name__} must implement load_checkpoint()")

    def get_state(self) -> Any:
        """The state as an in-memory object, or None to use `save_checkpoint`."""
        return None

    def set_state(self, state: Any) -> None:
        """Restore what `get_state` returned."""
        raise NotImplementedError(f"{type(self).__name__} returned a state but does not implement set_state()")

    def cleanup(self) -> None:
        """Release resources at the end of a stage batch."""
