"""Searchers given to a Tuner as every Tune searcher is: constructed with no
arguments, the space in ``param_space`` (Tune domains inside a sequence's
list), the horizon from ``RunConfig.stop`` or the scheduler, end to end; and
HyperBandForBOHB, the scheduler half of BOHB, talking to the searcher."""

import random
import time

import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler, HyperBandForBOHB
from ray.tune.search import Searcher, SearchGenerator
from trainables_for_tests import fit_under_a_budget

from ray_stagetree import MultiStep, Tuner, get_hparams
from ray_stagetree.searchers import StructuredBO

ITERATIONS = 6
SPACE = {"lr": MultiStep(tune.uniform(0.01, 0.5), [tune.randint(2, 8)], 0.3)}


def decay(config):
    """Loss falls by this iteration's learning rate; ends after ITERATIONS by itself."""
    loss = 1.0
    for _ in range(ITERATIONS):
        loss *= 1 - get_hparams()["lr"]
        tune.report({"loss": loss})


def study(tmp_path, search_alg, num_samples, stop=None, scheduler=None):
    tuner = Tuner(
        decay,
        param_space=SPACE,
        tune_config=tune.TuneConfig(
            search_alg=search_alg, num_samples=num_samples, metric="loss", mode="min", scheduler=scheduler
        ),
        run_config=tune.RunConfig(stop=stop, storage_path=str(tmp_path), name="study", verbose=0),
    )
    grid = tuner.fit()
    assert grid.num_errors == 0, grid.errors
    assert len(grid) == num_samples
    milestones = {milestone(result.config["lr"]) for result in grid}
    assert milestones <= set(range(2, 8)) and len(milestones) > 1, "milestones drawn from tune.randint(2, 8)"
    return grid


def milestone(lr):
    """The first milestone of a trial's MultiStep (its spec, as result.config shows it today, or the object)."""
    return lr["milestones"][0] if isinstance(lr, dict) else lr.milestones[0]


@pytest.mark.parametrize(
    "stop, scheduler",
    [
        ({"training_iteration": ITERATIONS}, None),
        (None, ASHAScheduler(max_t=ITERATIONS, grace_period=2)),
        (None, None),  # open-ended: the trainable ends its trials
    ],
    ids=["stop", "max_t", "open_ended"],
)
def test_structured_bo_with_no_arguments_searches_the_tuners_param_space(tmp_path, ray_session, stop, scheduler):
    """It used to need horizon= and the space in its constructor; given the
    space through param_space, every study failed with "100 random draws ...
    refuse their parameters"."""
    study(tmp_path, StructuredBO(), 12, stop, scheduler)


@pytest.mark.parametrize("name", ["optuna", "hyperopt"])
def test_tunes_searchers_search_domains_inside_a_sequences_list(tmp_path, ray_session, name):
    if name == "optuna":
        pytest.importorskip("optuna")
        from ray.tune.search.optuna import OptunaSearch as Searcher
    else:
        pytest.importorskip("hyperopt")
        from ray.tune.search.hyperopt import HyperOptSearch as Searcher
    # Seeded: unseeded, all 4 draws of tune.randint(2, 8) come out equal once in 216 runs (CI saw it).
    searcher = Searcher(seed=0) if name == "optuna" else Searcher(random_state_seed=0)
    study(tmp_path, searcher, 4, {"training_iteration": ITERATIONS})


class PauseLog(Searcher):
    """Random ``lr`` in [0.1, 1); writes what HyperBandForBOHB tells it
    (pauses, resumes, the bracket budget in a result) to ``path``, one line each."""

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.rng = random.Random(0)

    def _log(self, *words):
        with open(self.path, "a") as file:
            file.write(" ".join(map(str, words)) + "\n")

    def suggest(self, trial_id):
        return {"lr": 0.1 + 0.9 * self.rng.random()}

    def on_trial_result(self, trial_id, result):
        budget = result.get("hyperband_info", {}).get("budget")
        if budget is not None:
            self._log("budget", trial_id, result["training_iteration"], budget)

    def on_trial_complete(self, trial_id, result=None, error=False):
        pass

    def on_pause(self, trial_id):
        self._log("pause", trial_id)

    def on_unpause(self, trial_id):
        self._log("unpause", trial_id)


def linear(config):
    for iteration in range(1, 100):
        tune.report({"x": config["lr"] * iteration})


def test_hyperband_for_bohb_halves_its_bracket_and_talks_to_the_searcher(tmp_path, ray_session):
    """It used to be refused as a scheduler that "changes trials' configs or
    resources". One bracket of 9 trials, max_t=9, reduction_factor=3: 9 run 1
    iteration, 3 of them 3, 1 of those 9. The searcher is told of pauses and
    resumes, and gets each milestone's budget in the result, after the
    scheduler wrote it (what TuneBOHB learns from), as many as under Tune."""
    log = tmp_path / "searcher.log"
    grid = Tuner(
        linear,
        param_space={"lr": tune.uniform(0.1, 1.0)},
        tune_config=tune.TuneConfig(
            metric="x",
            mode="max",
            num_samples=9,
            search_alg=PauseLog(str(log)),
            scheduler=HyperBandForBOHB(time_attr="training_iteration", max_t=9, reduction_factor=3),
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="bohb", stop={"training_iteration": 9}, verbose=0),
    ).fit()
    assert grid.num_errors == 0
    lengths = sorted(result.metrics["training_iteration"] for result in grid)
    assert lengths == [1] * 6 + [3] * 2 + [9]
    best = max(grid, key=lambda result: result.config["lr"])
    assert best.metrics["training_iteration"] == 9, "the best learning rate survives both halvings"
    assert grid.iterations_executed == sum(lengths)
    lines = [line.split() for line in log.read_text().splitlines()]
    budgets = sorted(float(words[3]) for words in lines if words[0] == "budget")
    # As under Tune: a result HyperBand answers STOP to (the survivor's last at max_t, and the one closing a
    # halving if the halving cuts the trial that sent it) reaches the searcher at its trial's end, not with
    # on_trial_result. Which trial closes a halving depends on the order trials reach the milestone.
    assert set(budgets) == {1.0, 3.0}, "each milestone's budget reached the searcher with the result"
    assert budgets.count(1.0) in (8, 9) and budgets.count(3.0) in (2, 3), budgets
    paused = [words[1] for words in lines if words[0] == "pause"]
    resumed = [words[1] for words in lines if words[0] == "unpause"]
    assert paused and set(resumed) <= set(paused)


class SuggestionLog(Searcher):
    """Random ``lr`` in [0.1, 1); writes a line per suggestion and per completion to ``path``."""

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.rng = random.Random(0)

    def _log(self, word):
        with open(self.path, "a") as file:
            file.write(word + "\n")

    def suggest(self, trial_id):
        self._log("suggest")
        return {"lr": 0.1 + 0.9 * self.rng.random()}

    def on_trial_complete(self, trial_id, result=None, error=False):
        self._log("complete")


def slow_linear(config):
    for iteration in range(1, 4):
        time.sleep(0.3)
        tune.report({"x": config["lr"] * iteration})


def searched(tmp_path, name, num_samples, **tune_config):
    log = tmp_path / f"{name}.log"
    grid = Tuner(
        slow_linear,
        param_space={"lr": tune.uniform(0.1, 1.0)},
        tune_config=tune.TuneConfig(
            metric="x", mode="max", num_samples=num_samples, search_alg=SuggestionLog(str(log)), **tune_config
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name=name, verbose=0),
    ).fit()
    return grid, log.read_text().split()


def test_a_search_generator_asks_the_searcher_it_wraps_as_tune_does(tmp_path, ray_session):
    """Tune takes a ``SearchAlgorithm`` too: ``SearchGenerator(searcher)``
    is the searcher it wraps (it was refused as not a Searcher)."""
    log = tmp_path / "wrapped.log"
    grid = Tuner(
        slow_linear,
        param_space={"lr": tune.uniform(0.1, 1.0)},
        tune_config=tune.TuneConfig(
            metric="x", mode="max", num_samples=2, search_alg=SearchGenerator(SuggestionLog(str(log)))
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="wrapped", verbose=0),
    ).fit()
    assert grid.num_errors == 0 and len(grid) == 2
    assert sorted(log.read_text().split()) == ["complete"] * 2 + ["suggest"] * 2


def test_a_searcher_is_asked_for_a_trial_only_while_none_of_its_trials_waits_for_a_worker(tmp_path, ray_session):
    """As under Tune (TUNE_MAX_PENDING_TRIALS_PG "auto": one pending trial for
    a searcher), so that the searcher learns from results between its
    suggestions. All 8 trials used to be suggested before any result (TPE
    searched at random); on 2 workers, Tune suggests 3 before the first ends."""
    grid, log = searched(tmp_path, "paced", 8)
    assert grid.num_errors == 0 and len(grid) == 8
    before_first_completion = log.index("complete")
    assert before_first_completion <= 3, log  # 2 running, 1 waiting for a worker


def test_an_open_ended_search_under_a_time_budget_admits_only_the_trials_it_can_run(tmp_path, ray_session):
    """num_samples=-1 with a time budget: the searcher is asked as trials
    start, so the ResultGrid holds the trials that reported, those the
    budget stopped before their first result (at most one per worker) and at
    most one that waited, as under Tune (it used to admit thousands, nearly
    all never trained)."""

    def reported(grid):
        return [result for result in grid if result.metrics.get("training_iteration")]

    grid, log = fit_under_a_budget(
        lambda budget: searched(tmp_path, f"open_ended_{budget}", -1, time_budget_s=budget),
        lambda grid_and_log: reported(grid_and_log[0]),
    )
    ran = reported(grid)
    assert ran and len(grid) <= len(ran) + 2 + 1, (len(grid), len(ran))
    assert log.count("suggest") == len(grid)


class Late(Searcher):
    """Suggests nothing for its first 2 s (a searcher waiting for a service, say), then 3 trials."""

    def __init__(self):
        super().__init__(metric="x", mode="max")
        self.started = None
        self.suggested = 0

    def suggest(self, trial_id):
        self.started = self.started or time.monotonic()
        if time.monotonic() - self.started < 2:
            return None
        if self.suggested == 3:
            return Searcher.FINISHED
        self.suggested += 1
        return {"lr": 0.1 * self.suggested}

    def on_trial_complete(self, trial_id, result=None, error=False):
        pass


def test_a_searcher_that_suggests_nothing_while_nothing_runs_is_asked_again(tmp_path, ray_session):
    """Tune waits for it, asking every second; the study used to fail at
    once ("no batch can be dispatched but 0 requests are open")."""
    grid = Tuner(
        slow_linear,
        tune_config=tune.TuneConfig(search_alg=Late(), num_samples=-1),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="late", verbose=0),
    ).fit()
    assert grid.num_errors == 0
    assert sorted(result.config["lr"] for result in grid) == pytest.approx([0.1, 0.2, 0.3])


class Remembering(Searcher):
    """Suggests learning rates in turn and remembers every trial's last loss."""

    def __init__(self):
        super().__init__(metric="loss", mode="min")
        self.suggested = 0
        self.completed = {}

    def suggest(self, trial_id):
        self.suggested += 1
        return {"lr": MultiStep(0.1 * self.suggested, [3], 0.3)}

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.completed[trial_id] = result["loss"]


@pytest.mark.parametrize("limited", [False, True])
def test_the_searcher_object_given_to_the_tuner_is_the_one_that_learned(tmp_path, ray_session, limited):
    """As under Tune, which runs the searcher in the driver: after fit() the
    object passed as search_alg (and, inside a ConcurrencyLimiter, the
    user's inner object) holds what the study taught it (it ran on the
    controller, so the user's object had learned nothing)."""
    from ray.tune.search import ConcurrencyLimiter

    searcher = Remembering()
    search_alg = ConcurrencyLimiter(searcher, max_concurrent=2) if limited else searcher
    grid = Tuner(
        decay,
        tune_config=tune.TuneConfig(search_alg=search_alg, num_samples=3),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert searcher.suggested == 3
    assert searcher.completed == {result.metrics["trial_id"]: result.metrics["loss"] for result in grid}
    if limited:
        assert search_alg.searcher is searcher and not search_alg.live_trials
