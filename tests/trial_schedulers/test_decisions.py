"""The decision words are Ray's own, so Tune-fed adapters pass answers through."""

from ray.tune.schedulers import TrialScheduler

from ray_stagetree.planning.decisions import CONTINUE, PAUSE, STOP


def test_the_decision_words_are_rays():
    assert (CONTINUE, STOP, PAUSE) == (TrialScheduler.CONTINUE, TrialScheduler.STOP, TrialScheduler.PAUSE)
