"""`follow_optimizer_hparams`: what the framework integrations apply at an
iteration's start. A stage worker hands the running batch's context to
`ray_stagetree.trainables.live`; here a stand-in context says which keys
change, as `StageContext.follow` does."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ray_stagetree.trainables import live  # noqa: E402
from ray_stagetree.trainables.torch import follow_optimizer_hparams  # noqa: E402


class ChangingValues:
    """A batch's context whose config changes ``changes`` at this iteration."""

    def __init__(self, changes):
        self.changes = changes
        self.followed: set[str] = set()

    def follow(self, follows):
        self.followed = {key for key in self.changes if follows(key)}
        return {key: value for key, value in self.changes.items() if key in self.followed}


@pytest.fixture
def changing():
    def use(changes):
        context = ChangingValues(changes)
        live.use_stage_context(lambda: context)
        return context

    yield use
    live.use_stage_context(lambda: None)


def sgd(lr=0.1):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr, momentum=0.9)


def test_optimizer_values_that_change_are_applied_and_followed_others_left_to_the_trainable(changing):
    optimizer = sgd()
    context = changing({"optim/lr": 0.01, "momentum": 0.5, "batch_size": 64, "dropout": 0.2})
    applied = follow_optimizer_hparams(optimizer)
    assert applied == {"optim/lr": 0.01, "momentum": 0.5}
    assert context.followed == {"optim/lr", "momentum"}  # batch_size still restarts the trainable where it changes
    assert optimizer.param_groups[0]["lr"] == 0.01 and optimizer.param_groups[0]["momentum"] == 0.5


def test_hugging_faces_learning_rate_key_sets_lr_and_a_key_the_optimizer_lacks_is_not_followed(changing):
    adam = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    context = changing({"learning_rate": 5e-4, "momentum": 0.5})
    follow_optimizer_hparams(adam)
    assert adam.param_groups[0]["lr"] == 5e-4
    assert context.followed == {"learning_rate"}  # Adam has no momentum: the trainable restarts where it changes


def test_a_sequence_sets_the_base_rate_and_a_scheduler_keeps_scaling_it(changing):
    optimizer = sgd(0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    optimizer.step()
    scheduler.step()  # lr 0.05: factor 0.5 of the base 0.1
    changing({"lr": 0.02})
    follow_optimizer_hparams([optimizer], [scheduler])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)
    assert scheduler.base_lrs == [0.02]
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.005)  # the new base, the scheduler's factor at step 2


def test_nothing_changes_nothing_is_touched(changing):
    optimizer = sgd(0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
    optimizer.step()
    scheduler.step()
    changing({})
    assert follow_optimizer_hparams(optimizer, [scheduler]) == {}
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)  # the trainable's own schedule runs as written


def test_outside_any_trial_there_is_nothing_to_follow():
    optimizer = sgd(0.1)
    assert follow_optimizer_hparams(optimizer) == {}
    assert optimizer.param_groups[0]["lr"] == 0.1
