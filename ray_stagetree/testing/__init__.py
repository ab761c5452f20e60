"""Conformance suites for what a contributor adds: a sequence family, an
execution policy, a hosted trial scheduler, a searcher over sequences.

Each ``check_*`` runs the invariants every implementation the project ships
satisfies (the project's own tests run them on each: ``tests/test_testing.py``)
and raises ``AssertionError`` naming the first that breaks, as
scikit-learn's ``check_estimator`` does for an estimator. Ray-free: they run
the real planner on simulated workers (`ray_stagetree.simulation`).

Examples
--------
>>> from ray_stagetree import MultiStep
>>> from ray_stagetree.planning import POLICIES
>>> from ray_stagetree.testing import check_execution_policy, check_sequence
>>> check_sequence(MultiStep(0.1, [30, 60], 0.1))
>>> check_execution_policy(POLICIES["critical_path"]())
"""

from ray_stagetree.testing.conformance import (
    check_execution_policy,
    check_searcher,
    check_sequence,
    check_trial_scheduler,
)

__all__ = ["check_execution_policy", "check_searcher", "check_sequence", "check_trial_scheduler"]
