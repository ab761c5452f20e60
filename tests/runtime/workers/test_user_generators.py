"""The trainable's own generators (`runtime.workers.user_generators`):
NumPy's are not carried in stage checkpoints, so one made while the
trainable sets up and drawn from across iterations is warned of."""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest

from ray_stagetree.runtime.workers import user_generators
from ray_stagetree.runtime.workers.user_generators import NUMPY_GENERATOR_WARNING, UserGenerators, track_numpy


@pytest.fixture
def tracked_numpy(monkeypatch):
    """A copy of ``numpy.random`` whose ``default_rng`` reports to a fresh tracker, as on a stage worker."""
    monkeypatch.setattr(user_generators, "_warned", False)
    tracker = UserGenerators()
    numpy = types.SimpleNamespace(random=types.SimpleNamespace(default_rng=np.random.default_rng))
    track_numpy(numpy, lambda: tracker)
    return numpy, tracker


def test_a_setup_generator_drawn_from_across_iterations_is_warned_of_once(tracked_numpy):
    numpy, tracker = tracked_numpy
    shuffle = numpy.random.default_rng(0)
    shuffle.permutation(10)  # the first iteration
    tracker.setup_done()  # its report
    shuffle.permutation(10)  # the second iteration draws on
    with pytest.warns(UserWarning, match="numpy.random.Generator") as caught:
        tracker.setup_done()
    assert str(caught[0].message) == NUMPY_GENERATOR_WARNING
    tracker.new_run()
    again = numpy.random.default_rng(0)
    tracker.setup_done()
    again.random()
    with warnings.catch_warnings(record=True) as later:
        warnings.simplefilter("always")
        tracker.setup_done()
    assert later == []  # once per worker


def test_a_generator_made_per_iteration_or_left_alone_is_fine(tracked_numpy, recwarn):
    numpy, tracker = tracked_numpy
    unused = numpy.random.default_rng(0)  # made at setup, never drawn from after the first report
    numpy.random.default_rng((0, 0)).permutation(10)  # epoch 0's, from (seed, epoch)
    tracker.setup_done()
    numpy.random.default_rng((0, 1)).permutation(10)  # epoch 1's: made after setup, not tracked
    tracker.setup_done()
    assert unused is not None and not [w for w in recwarn if "numpy.random.Generator" in str(w.message)]
