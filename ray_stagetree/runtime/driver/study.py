"""Study operations from the Hippo paper, on a finished study's directory:
evaluate any configuration at any iteration, and extend a trial.

Both reuse everything the study already trained: the saved search plan
answers what it knows at once, and what it does not know trains from the
nearest stored checkpoint, with the same stage sharing as the study itself.
"""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Callable
from typing import Any

from ray import tune

from ray_stagetree.execution.batches import REPORTED_CHECKPOINT
from ray_stagetree.planning.plan import SearchPlan
from ray_stagetree.runtime.driver.run import StudyRun
from ray_stagetree.runtime.driver.tuner import Tuner, in_existing_experiment
from ray_stagetree.searchers.sources import VariantSource


class Study:
    """A study directory written by `Tuner.fit`, opened for more work.

    Parameters
    ----------
    experiment_path:
        ``ResultGrid.experiment_path`` of the study.
    trainable:
        The study's trainable (with the same ``tune.with_resources`` /
        ``tune.with_parameters`` wrapping).
    storage_filesystem:
        As given to the study's ``RunConfig``.

    Examples
    --------
    >>> study = Study(results.experiment_path, train)          # doctest: +SKIP
    >>> study.evaluate({"lr": Exponential(0.1, 0.9)}, 30)       # doctest: +SKIP
    >>> study.extend(results[0].metrics["trial_id"], 200)       # doctest: +SKIP
    """

    def __init__(self, experiment_path: str, trainable: Callable | type, storage_filesystem: Any = None) -> None:
        self.experiment_path = experiment_path.rstrip("/")
        self.trainable = trainable
        self.storage_filesystem = storage_filesystem

    def _plan(self) -> SearchPlan:
        return SearchPlan.load(f"{self.experiment_path}/plan", self.storage_filesystem)

    def _tuner(self, horizon: int) -> Tuner:
        storage, name = posixpath.split(self.experiment_path)
        with in_existing_experiment():  # the study's own settings stay: Tuner.restore reads them
            return Tuner(
                self.trainable,
                run_config=tune.RunConfig(
                    name=name,
                    storage_path=storage,
                    storage_filesystem=self.storage_filesystem,
                    stop={"training_iteration": horizon},
                    verbose=0,
                ),
            )

    def evaluate(self, config: dict[str, Any], iteration: int) -> dict[str, Any]:
        """Metrics of ``config`` after ``iteration`` iterations: from the plan
        when the study (or an earlier call) trained that point, else trained
        from the nearest checkpoint on its path."""
        tuner = self._tuner(iteration)
        probe = f"evaluate_{uuid.uuid4().hex[:8]}"
        request = self._plan().add_trial(probe, config, iteration)
        if request.answered:
            return {key: value for key, value in request.node.metrics[iteration].items() if key != REPORTED_CHECKPOINT}
        grid = StudyRun(tuner).execute(VariantSource([config], [probe]), iteration, resume=True)
        result = grid[0]
        if result.error is not None:
            raise result.error
        return result.metrics

    def extend(self, trial_id: str, iteration: int) -> tune.Result:
        """Train a study's trial on to ``iteration``, from its last checkpoint."""
        plan = self._plan()
        if trial_id not in plan.trials:
            raise KeyError(f"no trial {trial_id!r} in the study at {self.experiment_path!r}")
        record = plan.trials[trial_id]
        if iteration <= record.request.iteration:
            raise ValueError(
                f"trial {trial_id!r} already ran {record.request.iteration} iterations; extend it beyond that, "
                f"got {iteration}"
            )
        if not record.config.complete:
            # The plan holds such values only as fingerprints; their objects are pickles, which Study never reads.
            held = ", ".join(
                f"config[{name!r}] = {value!r}"
                for name, value in record.config.static.items()
                if name in record.config.pickled
            )
            raise ValueError(
                f"trial {trial_id!r} has config values JSON cannot hold ({held}): Study reads no pickles, so it "
                f"cannot rebuild them; continue the study with Tuner.restore({self.experiment_path!r}, trainable), "
                "which trusts its snapshot, or evaluate the full config with Study.evaluate(config, iteration)"
            )
        config = record.config.to_config()
        grid = StudyRun(self._tuner(iteration)).execute(VariantSource([config], [trial_id]), iteration, resume=True)
        return grid[0]
