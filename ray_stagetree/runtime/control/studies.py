"""The studies on a loop's plan (`batch_loop.BatchLoop`): `Studies`, each
trial's study found by its id, and `NodeConfigs`, what each node's batches
run and which study's trial configured it. Ray-free."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ray_stagetree.execution.batches import BatchOutcome
from ray_stagetree.planning.plan import PlanNode, SearchPlan
from ray_stagetree.planning.policies import StageBatch
from ray_stagetree.runtime.control.study_trials import StudyTrials
from ray_stagetree.runtime.control.trials import TrialState
from ray_stagetree.runtime.control.worker_shapes import Shape


class Studies(dict[str, StudyTrials]):
    """The loop's studies by id, and the routing of a trial id to its study."""

    def add(self, study: StudyTrials) -> None:
        self[study.study_id] = study

    def of(self, trial_id: str) -> StudyTrials | None:
        """The study whose trial ``trial_id`` is (None: a trial of an earlier run or a study gone)."""
        for study in self.values():
            if trial_id in study.trials:
                return study
        return None

    def status_of(self, trial_id: str) -> str | None:
        study = self.of(trial_id)
        return None if study is None else study.status_of(trial_id)

    def owning(self, trial_ids: Iterable[str]) -> list[tuple[str, StudyTrials]]:
        """``(trial id, study)`` of those of ``trial_ids`` a study owns, by trial id."""
        owned = []
        for trial_id in sorted(trial_ids):
            study = self.of(trial_id)
            if study is not None:
                owned.append((trial_id, study))
        return owned

    def grouped(self, trial_ids: Iterable[str]) -> dict[str, set[str]]:
        """``trial_ids`` grouped by the id of the study that owns each (others left out)."""
        groups: dict[str, set[str]] = {}
        for trial_id, study in self.owning(trial_ids):
            groups.setdefault(study.study_id, set()).add(trial_id)
        return groups

    def served(self, trial_ids: Iterable[str]) -> list[StudyTrials]:
        """The studies owning any of ``trial_ids`` (`served_by`)."""
        return self.served_by(self.owning(trial_ids))

    def served_by(self, owned: list[tuple[str, StudyTrials]]) -> list[StudyTrials]:
        """The studies of ``owned`` (`owning`'s pairs); every study when
        there are none (work no study's trial needs now counts as each one's)."""
        return list({study.study_id: study for _, study in owned}.values()) or list(self.values())

    def shape_of(self, batch: StageBatch, default: Shape) -> Shape:
        """The worker ``batch`` needs: the least that covers each of its
        trials' resources, those a ``ResourceChangingScheduler`` set, or its
        config asked for (`StudySpec.trial_request`), or ``default``."""
        if not self.change_resources():
            return default
        return self.shape_of_trials([t for request in batch.requests for t in request.trials], default)

    def change_resources(self) -> bool:
        """Whether a study's scheduler changes its trials' resources, or its
        trials ask for their own (only then may a batch need a worker of
        another shape than the study's)."""
        return any(study.host.changes_resources or study.spec.trial_request is not None for study in self.values())

    def shape_of_trials(self, trial_ids: Iterable[str], default: Shape) -> Shape:
        """The least worker shape that covers each of ``trial_ids``' resources (`shape_of`)."""
        if not self.change_resources():
            return default
        shape = Shape()
        for trial_id, study in self.owning(trial_ids):
            resources = study.host.trial_resources(trial_id) or study.trials[trial_id].resources
            shape |= default if resources is None else Shape.of_trial_resources(resources)
        return shape if shape.amounts else default

    def output(self, trial_ids: Iterable[str], chunks: list[tuple[str, str]]) -> None:
        """A batch's trainable printed ``chunks`` (`BatchOutcome.output`): each
        study that keeps its trials' output takes them for those it owns."""
        if chunks:
            for trial_id, study in self.owning(trial_ids):
                study.output(trial_id, chunks)

    def keep_decision_points(self) -> bool:
        """Whether a batch continuing live past a decision point checkpoints there (`StudyTrials.keeps_decision_points`)."""
        return any(study.keeps_decision_points for study in self.values())

    def configured_saves(self, plan: SearchPlan, batch_id: int, outcome: BatchOutcome | None = None) -> list[int]:
        """CheckpointConfig's saves on a batch, as each study asks (`StudyTrials.configured_saves`)."""
        segments = plan.batch_segments(batch_id)
        last = outcome.records[-1][:2] if outcome is not None and outcome.records else None
        return sorted({at for study in self.values() for at in study.configured_saves(segments, last)})

    def fail(self, trial_ids: Iterable[str], error: str, *args: Any) -> None:
        """Each study fails its own trials (`StudyTrials.fail`)."""
        for study_id, ids in self.grouped(trial_ids).items():
            self[study_id].fail(ids, error, *args)

    def resume_paused(self) -> None:
        for study in list(self.values()):
            study.resume_paused()

    def warn(self, warning: str) -> None:
        """The loop's own warning: every study's driver hears it."""
        for study in self.values():
            study.feed.warn(warning)


@dataclass
class NodeConfig:
    """What a node's batches run: the config as the trainable takes it
    (sequences as the user's objects), the names it holds fixed, and the
    trial that configured it (no study: a node of a stored plan)."""

    config: dict[str, Any]
    plain: frozenset[str] = frozenset()
    study: StudyTrials | None = None
    trial_id: str = ""


class NodeConfigs:
    """Each node's `NodeConfig`: the first trial requesting a node
    configures it (a node whose objects were not stored, see
    `planning.persistence`, gets the config of the first trial requesting
    it: their fingerprints are equal)."""

    def __init__(self, plan: SearchPlan) -> None:
        self._configs = {
            node.node_id: NodeConfig(node.config.to_config()) for node in plan.nodes if node.config.complete
        }

    def configure(self, node: PlanNode, state: TrialState, study: StudyTrials, restored: bool = False) -> None:
        """``state`` requests ``node``; ``restored``: a restored trial's node,
        whose trainable gets the user's config objects, not their JSON round trip."""
        if restored or node.node_id not in self._configs:
            self._configs[node.node_id] = NodeConfig(state.config, state.plain, study, state.trial_id)

    def __getitem__(self, node_id: int) -> NodeConfig:
        return self._configs[node_id]

    def forget(self, study: StudyTrials) -> None:
        """The study detached: its nodes keep their configs, no longer its trials' names."""
        for node_id, node in self._configs.items():
            if node.study is study:
                self._configs[node_id] = NodeConfig(node.config, node.plain)
