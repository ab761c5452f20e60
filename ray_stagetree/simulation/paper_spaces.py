"""Search spaces of the Hippo paper's evaluation, as Tune ``param_space`` dicts.

Used by the examples, the release benchmarks and the tests, so that every
figure we quote is measured on the same space. Draw trials with
`ray_stagetree.searchers.generate_trials` (or pass the space to the Tuner).

The paper's Tables 2-4 list *examples* from each space; the spaces below keep
those examples and add parameter values of the same function families until
the trial counts of Table 1 are reached, with merge rates close to the
paper's (printed by ``release/bench_simulator.py``):

=====================  ======  ============  =========================
space                  trials  merge rate    paper (Table 1)
=====================  ======  ============  =========================
`resnet56_sha_space`   448     2.43          448, 2.447 (SHA and ASHA)
`mobilenetv2_space`    240     3.13          240, 3.144 (grid)
`bert_base_space`      40      2.05          40, 2.045 (grid)
=====================  ======  ============  =========================

`resnet20_study_spaces` are the eight studies of 144 trials of each
multi-study set (section 6.2), whose exact spaces the paper does not give.
"""

from __future__ import annotations

from typing import Any

from ray.tune.schedulers import HyperBandScheduler

from ray_stagetree.sequences import (
    Cosine,
    CyclicLR,
    Exponential,
    Linear,
    MultiStep,
    Sequence,
    Warmup,
)
from ray_stagetree.trial_schedulers.ray_fields import hyperband_bracket_class

#: Max training iterations (epochs) of the ResNet56 studies (Table 1).
RESNET56_HORIZON = 120
#: Max epochs of the MobileNetV2 study (Table 1) and of the ResNet20 multi-study sets.
MOBILENETV2_HORIZON = RESNET20_HORIZON = 120
#: BERT-Base trains 27,000 steps (Table 1); one iteration here is this many
#: steps, so that a trial is 270 iterations rather than 27,000 reports.
BERT_STEPS_PER_ITERATION = 100
BERT_BASE_HORIZON = 27_000 // BERT_STEPS_PER_ITERATION

# The paper gives warm-ups as (duration, target); it does not give the start,
# so warm-ups start at a tenth of the target, as in Goyal et al.'s recipe.
_WARMUP_START = 0.01


def resnet56_space() -> dict[str, Any]:
    """Table 2 of the Hippo paper: 5 x 2 x 2 x 2 x 3 = 120 grid trials.

    Examples
    --------
    >>> from ray_stagetree.searchers import generate_trials
    >>> len(generate_trials(resnet56_space()))
    120
    """
    from ray import tune

    step_decay = MultiStep(0.1, [90, 135], 0.1)
    return {
        "lr": tune.grid_search(
            [
                step_decay,
                Warmup(_WARMUP_START, 5, step_decay),
                Warmup(_WARMUP_START, 5, Exponential(0.1, 0.95)),
                Warmup(_WARMUP_START, 10, Cosine(0.1, 0.0, 20)),
                CyclicLR(0.001, 0.1, 20),
            ]
        ),
        "batch_size": tune.grid_search([128, MultiStep(values=(128, 256), milestones=[70])]),
        "momentum": tune.grid_search([0.9, MultiStep(values=(0.7, 0.8, 0.9), milestones=[40, 80])]),
        "weight_decay": tune.grid_search([1e-4, 1e-3]),
        "optimizer": tune.grid_search(["adam", "sgd", "sgd_momentum"]),
    }


def _step_decays(init: float, milestone_sets: list[list[int]], warmup: int) -> list[Sequence]:
    """Step decay by 10x at each milestone set, without and with a warm-up."""
    out: list[Sequence] = []
    for milestones in milestone_sets:
        decay = MultiStep(init, milestones, 0.1)
        out += [decay, Warmup(init * _WARMUP_START / 0.1, warmup, decay)]
    return out


def resnet56_sha_space() -> dict[str, Any]:
    """Table 1's ResNet56 space for SHA and ASHA: 448 trials, merge rate 2.43
    (paper: 2.447). Table 2's functions with 14 learning-rate sequences, four
    batch-size sequences, two weight decays and the three optimizers; draw
    with ``filter=resnet56_filter`` (momentum is tuned only with SGD with
    momentum; Adam and vanilla SGD keep the constant 0.9, which they ignore).

    Examples
    --------
    >>> from ray_stagetree.searchers import generate_trials
    >>> len(generate_trials(resnet56_sha_space(), filter=resnet56_filter))
    448
    """
    from ray import tune

    lrs = _step_decays(0.1, [[60, 120], [80, 120], [90, 135], [100, 150]], 5)
    lrs += [Warmup(_WARMUP_START, 5, Exponential(0.1, gamma)) for gamma in (0.95, 0.97)]
    lrs += [Warmup(_WARMUP_START, 10, Cosine(0.1, 0.0, period)) for period in (20, 40)]
    lrs += [CyclicLR(0.001, 0.1, 20), Warmup(_WARMUP_START, 10, Cosine(0.1, 0.0, 20, 2))]
    return {
        "lr": tune.grid_search(lrs),
        "batch_size": tune.grid_search([128] + [MultiStep(values=(128, 256), milestones=[m]) for m in (50, 80, 100)]),
        "momentum": tune.grid_search([0.9, MultiStep(values=(0.7, 0.8, 0.9), milestones=[40, 80])]),
        "weight_decay": tune.grid_search([1e-4, 1e-3]),
        "optimizer": tune.grid_search(["adam", "sgd", "sgd_momentum"]),
    }


def resnet56_filter(config: dict[str, Any]) -> bool:
    """Keep momentum sequences for SGD with momentum only (the thesis' filter)."""
    return config["optimizer"] == "sgd_momentum" or config["momentum"] == 0.9


def mobilenetv2_space() -> dict[str, Any]:
    """Table 3: MobileNetV2 on CIFAR-10, 240 grid trials, merge rate 3.13
    (paper: 3.144). 20 learning-rate sequences of Table 3's five families,
    four batch-size and three cutout-size sequences; SGD with momentum 0.9
    and weight decay 4e-5.

    Examples
    --------
    >>> from ray_stagetree.searchers import generate_trials
    >>> len(generate_trials(mobilenetv2_space()))
    240
    """
    from ray import tune

    lrs = _step_decays(0.1, [[100, 150], [80, 120], [60, 120], [90, 135]], 10)
    lrs += [Warmup(_WARMUP_START, 10, Exponential(0.1, gamma)) for gamma in (0.9, 0.93, 0.95, 0.97)]
    lrs += [Warmup(_WARMUP_START, 10, Cosine(0.1, 0.0, period)) for period in (20, 30, 40)]
    lrs += [Warmup(_WARMUP_START, 10, Cosine(0.1, 0.0, 20, 2))]
    lrs += [CyclicLR(0.001, top, half) for top, half in ((0.05, 20), (0.1, 20), (0.1, 10), (0.2, 20))]
    return {
        "lr": tune.grid_search(lrs),
        "batch_size": tune.grid_search([128] + [MultiStep(values=(128, 256), milestones=[m]) for m in (60, 90, 100)]),
        "cutout": tune.grid_search(
            [16] + [MultiStep(values=(16, 18, 20), milestones=m) for m in ([80, 100], [70, 100])]
        ),
        "optimizer": "sgd_momentum",
        "momentum": 0.9,
        "weight_decay": 4e-5,
    }


def bert_base_space() -> dict[str, Any]:
    """Table 4: BERT-Base fine-tuned on SQuAD 2.0, 40 grid trials of
    `BERT_BASE_HORIZON` iterations of `BERT_STEPS_PER_ITERATION` steps,
    merge rate 2.05 (paper: 2.045). Linear decay to zero at step 30,000 from
    four peak learning rates, with or without a 3,000-step warm-up from zero;
    the input sequence length stays 384 or grows to 512 at one of four steps.

    Examples
    --------
    >>> from ray_stagetree.searchers import generate_trials
    >>> len(generate_trials(bert_base_space()))
    40
    """
    from ray import tune

    total, warmup = 30_000 // BERT_STEPS_PER_ITERATION, 3_000 // BERT_STEPS_PER_ITERATION
    lrs: list[Sequence] = []
    for peak in (2e-5, 3e-5, 4e-5, 5e-5):
        lrs += [Linear(peak, 0.0, total), Warmup(0.0, warmup, Linear(peak, 0.0, total - warmup))]
    switches = [step // BERT_STEPS_PER_ITERATION for step in (9_000, 15_000, 21_000, 24_000)]
    return {
        "lr": tune.grid_search(lrs),
        "max_seq_length": tune.grid_search([384] + [MultiStep(values=(384, 512), milestones=[m]) for m in switches]),
    }


def _resnet20_lrs(scale: float, warmup: int) -> list[Sequence]:
    """39 learning-rate sequences of the usual families, peak ``0.1 * scale``."""
    peak = 0.1 * scale
    lrs = _step_decays(peak, [[60, 90], [80, 120], [90, 135], [100, 150], [40, 80], [50, 100]], warmup)
    start = _WARMUP_START * scale
    lrs += [Warmup(start, warmup, Exponential(peak, g)) for g in (0.9, 0.93, 0.95, 0.97, 0.98, 0.99)]
    lrs += [Warmup(start, warmup, Cosine(peak, 0.0, period)) for period in (10, 20, 30, 40)]
    lrs += [Warmup(start, warmup, Cosine(peak, 0.0, period, 2)) for period in (10, 20)]
    lrs += [CyclicLR(0.001 * scale, top * scale, half) for top in (0.05, 0.1, 0.2) for half in (10, 20, 30)]
    for end in (0.0, 0.001, 0.01):
        lrs += [Linear(peak, end, 120), Warmup(start, warmup, Linear(peak, end, 120 - warmup))]
    return lrs


def resnet20_study_spaces(overlap: str = "high") -> list[dict[str, Any]]:
    """The eight ResNet20 / CIFAR-10 studies of a multi-study set (section
    6.2): 144 trials each (36 learning-rate x 4 batch-size sequences).

    The paper gives only their merge rates. ``"high"``: studies 1-4 draw
    from one pool of learning-rate sequences, 5-8 from pools scaled by
    1.05-1.4, so study merge rates are 2.0-2.4 and the k-wise rates of S2,
    S4 and S8 2.53, 2.73, 2.41 (paper: 1.5-2.73; 2.26, 2.77, 2.47).
    ``"low"``: every study has its own scale and warm-up and constant-256
    batch sizes, so study rates are 1.5-1.8 and the k-wise rates of S2, S4
    and S8 1.60, 1.62, 1.62 (paper: 1.2-2.1; 1.40, 1.19, 1.66).
    """
    from ray import tune

    if overlap not in ("high", "low"):
        raise ValueError(f"overlap must be 'high' or 'low', got {overlap!r}")
    spaces = []
    for index in range(8):
        if overlap == "high":
            pool = _resnet20_lrs([1.0, 1.0, 1.05, 1.05, 1.1, 1.2, 1.3, 1.4][index], 5)
            lrs = [pool[(9 * index + j) % len(pool)] for j in range(36)]
            milestones = [(40, 70, 100), (45, 75, 105), (50, 80, 110), (55, 85, 115)][index % 4]
            batch_sizes: list[Any] = [128]
        else:
            pool = _resnet20_lrs(1 + 0.1 * index, 5 + index % 3)
            lrs = [pool[(7 * index + j) % len(pool)] for j in range(36)]
            milestones = [(60, 90), (50, 80), (70, 100), (40, 70)][index % 4]
            batch_sizes = [128, 256]
        batch_sizes += [MultiStep(values=(128, 256), milestones=[m]) for m in milestones]
        spaces.append({"lr": tune.grid_search(lrs), "batch_size": tune.grid_search(batch_sizes)})
    return spaces


def resnet20_policy_space() -> dict[str, Any]:
    """The thesis' execution-policy study (section 6.3, Figure 6.4): ResNet20
    on CIFAR-10, learning rate and batch size tuned, merge rate 3.55. The
    thesis gives only the rate; this space has it (3.57): step decays by 10x
    from a peak of 0.05, 0.1 or 0.2 at ten milestone pairs, each without and
    with a 5-epoch warm-up, times a constant batch of 128 or one doubling to
    256 at epoch 50, 70, 90 or 110: 300 trials.

    Examples
    --------
    >>> from ray_stagetree.planning.merge import merge_rate
    >>> from ray_stagetree.searchers import generate_trials
    >>> trials = generate_trials(resnet20_policy_space())
    >>> len(trials), round(merge_rate(trials, RESNET20_HORIZON), 2)
    (300, 3.57)
    """
    from ray import tune

    milestones = [[60, 90], [60, 100], [80, 100], [80, 110], [90, 110], [100, 110], [40, 80], [50, 100]]
    milestones += [[70, 100], [70, 110]]
    batch_sizes: list[Any] = [128] + [MultiStep(values=(128, 256), milestones=[m]) for m in (50, 70, 90, 110)]
    lrs = [lr for peak in (0.05, 0.1, 0.2) for lr in _step_decays(peak, milestones, 5)]
    return {"lr": tune.grid_search(lrs), "batch_size": tune.grid_search(batch_sizes)}


class SuccessiveHalving(HyperBandScheduler):
    """Synchronous successive halving (SHA), as the paper's Table 1 runs it:
    one bracket of ``num_trials`` trials, evaluated at ``grace_period``; the
    best ``1 / reduction_factor`` go on to ``grace_period * reduction_factor``
    iterations, and so on up to ``max_t``. This is Ray's synchronous
    HyperBand, restricted to that one bracket (Ray's own fills brackets of
    several sizes and cannot be given a minimum).

    Examples
    --------
    >>> sha = SuccessiveHalving(448, grace_period=15, max_t=120, reduction_factor=4, metric="acc", mode="max")
    >>> sha.rungs
    [15, 60, 120]
    """

    def __init__(
        self,
        num_trials: int,
        grace_period: int,
        max_t: int,
        reduction_factor: float = 4,
        metric: str | None = None,
        mode: str | None = None,
        time_attr: str = "training_iteration",
    ) -> None:
        if not 0 < grace_period <= max_t:
            raise ValueError(f"need 0 < grace_period <= max_t, got {grace_period} and {max_t}")
        super().__init__(time_attr=time_attr, metric=metric, mode=mode, max_t=max_t, reduction_factor=reduction_factor)
        self._num_trials, self._grace_period = num_trials, grace_period
        self.rungs = [grace_period]
        while self.rungs[-1] < max_t:
            self.rungs.append(int(min(self.rungs[-1] * reduction_factor, max_t)))
        # One bracket per band, so every trial lands in the same bracket.
        self._s_max_1 = 1

    def _create_bracket(self, s: int) -> Any:
        # Ray's synchronous bracket; `SuccessiveHalving` only chooses its size.
        return hyperband_bracket_class()(
            time_attr=self._time_attr,
            max_trials=self._num_trials,
            init_t_attr=self._grace_period,
            max_t_attr=self._max_t_attr,
            eta=self._eta,
            s=len(self.rungs) - 1,
            stop_last_trials=self._stop_last_trials,
        )
