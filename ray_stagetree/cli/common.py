"""What the ``stagetree`` subcommands share: exit codes, the error a user
can act on, reading a spec or an experiment, starting Ray, printing tables."""

from __future__ import annotations

import argparse
import datetime
import json
import os
from typing import Any

from ray_stagetree.validation import short

OK, FAILED, USAGE, INTERRUPTED = 0, 1, 2, 130


EXIT_CODES = """exit codes:
  0    done: every trial finished (run, restore, submit), or the command did what it says
  1    the study ran but some trials ended in error, or it could not run (Ray, storage, a submitted job that failed)
  2    bad arguments, an invalid spec, or a path that is not an experiment
  130  interrupted (Ctrl-C): the study's state is saved; `stagetree restore PATH` continues it"""


#: What `stagetree submit` says when the cluster wants a token (Ray 2.60 clusters started with a token
#: on their head turn token authentication on; a Ray Jobs client sends it only when told to).
TOKEN_HELP = (
    "Set RAY_AUTH_MODE=token here, with the cluster's token in ~/.ray/auth_token, in RAY_AUTH_TOKEN, or in a file "
    "named by RAY_AUTH_TOKEN_PATH (`ray get-auth-token` on the head prints it); see "
    "docs/guides/clusters.md"
)


class CommandError(Exception):
    """A failure the user can act on: printed as one message, never a traceback."""

    def __init__(self, message: str, code: int = USAGE) -> None:
        super().__init__(message)
        self.code = code


def load_spec(path: str) -> Any:
    from ray_stagetree.jobs.spec import JobSpec

    return JobSpec.from_file(path)


def start_ray(args: argparse.Namespace) -> None:
    import ray

    from ray_stagetree.runtime.driver.cluster import init_ray

    if args.address:
        ray.init(
            address=args.address,
            num_cpus=args.num_cpus if args.address == "local" else None,
            include_dashboard=False,
            configure_logging=False,
        )
    else:
        init_ray(num_cpus=args.num_cpus, include_dashboard=False)


def default_name(data: dict[str, Any], spec_path: str) -> str | None:
    """The spec's name, else the spec file's name and the time, so the
    experiment's folder is known before it starts (its job file goes there)."""
    if data.get("run_config", {}).get("name"):
        return None
    stem = os.path.splitext(os.path.basename(spec_path))[0]
    return f"{stem}_{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}"


def save_job(path: str, spec: Any) -> None:
    """The spec beside the study, so `stagetree restore PATH` finds its
    trainable; sealed with the experiment's key, since it names code to import."""
    from ray_stagetree.execution.payload_auth import experiment_key, seal_record
    from ray_stagetree.execution.storage import CheckpointStorage
    from ray_stagetree.jobs.experiments import JOB_FILE

    record = {"spec": spec.data, "base_dir": spec.base_dir, "source": os.path.abspath(spec.source)}
    try:
        storage = CheckpointStorage(path)
        record["seal"] = seal_record(experiment_key(storage)[0], JOB_FILE, record)
        storage.write_text(JOB_FILE, json.dumps(record, indent=2))
    except OSError as error:
        raise CommandError(f"cannot write to the experiment directory {path!r}: {error}", FAILED) from None


def saved_job(path: str) -> Any:
    """The spec `save_job` left beside the study, if this machine's key for
    the experiment verifies it (or the folder is declared trusted): its
    imports run code, so a planted or edited file is refused."""
    from ray_stagetree.execution.payload_auth import TRUST_ENV, existing_key, trust_storage, verify_record
    from ray_stagetree.execution.storage import CheckpointStorage
    from ray_stagetree.jobs.experiments import JOB_FILE, read_experiment
    from ray_stagetree.jobs.spec import JobSpec

    job = read_experiment(path).job
    if job is None:
        raise CommandError(
            f"{path!r} was not started by `stagetree run` (no {JOB_FILE}): pass the spec it was started from with --spec"
        )
    tag = job.pop("seal", None)
    if not trust_storage() and not verify_record(existing_key(CheckpointStorage(path)), JOB_FILE, job, tag):
        raise CommandError(
            f"{JOB_FILE} in {path!r} is not authenticated by this experiment's key (written on another machine, "
            "or changed since); it names code to import, so it is not used. Pass the spec with --spec, or set "
            f"{TRUST_ENV}=1 if the folder is trusted"
        )
    return JobSpec(job["spec"], job["base_dir"], job["source"])


def check_no_other_driver(path: str) -> None:
    """A study another driver runs is not continued a second time into its folder."""
    from ray_stagetree.execution.storage import CheckpointStorage
    from ray_stagetree.runtime.driver.lease import ExperimentInUseError, check_free

    try:
        check_free(CheckpointStorage(path), path)
    except ExperimentInUseError as error:
        raise CommandError(str(error), FAILED) from None


def fit(tuner: Any) -> Any:
    """``tuner.fit()``; what it refuses (a drawn config that cannot run, resources
    the cluster lacks, storage other nodes cannot see) becomes a message. An
    interrupted study's message says how this command line continues it."""
    from ray_stagetree.runtime.driver.run import restore_hint

    try:
        with restore_hint(lambda path: f"stagetree restore {quote(path)}"):
            return tuner.fit()
    except (TypeError, ValueError, RuntimeError, OSError) as error:
        raise CommandError(f"the study could not run: {error}", FAILED) from None


def finish(results: Any, tune_config: Any) -> int:
    """The study's outcome on stdout, the exit code. Trials' statuses are read
    back from the experiment folder, as `stagetree status` reads them; the
    best trial is Tune's ``get_best_result()`` (the study's metric and mode,
    scope "last": each trial's last result), with its config."""
    from ray_stagetree.jobs.experiments import read_experiment
    from ray_stagetree.planning.lifecycle import ERROR, TERMINATED

    counts = read_experiment(results.experiment_path).counts()
    finished, errors = counts.get(TERMINATED, 0), counts.get(ERROR, 0)
    total = max(len(results), sum(counts.values()))
    unfinished = total - finished - errors
    print(
        f"\n{total} trials: {finished} finished, {errors} errors" + (f", {unfinished} unfinished" if unfinished else "")
    )
    print_best_result(results, tune_config.metric, tune_config.mode)
    executed, trial_by_trial = results.iterations_executed, results.trial_by_trial_iterations
    if unfinished:  # the remaining iterations are neither executed nor counted: no saving to claim yet
        print(f"iterations executed so far: {executed} (partial: the study stopped before its end)")
    else:
        print(f"iterations executed: {executed}; trial by trial: {trial_by_trial}")
    print(f"experiment: {results.experiment_path}  (stagetree show {quote(results.experiment_path)})")
    if unfinished:
        print(f"stopped early: stagetree restore {quote(results.experiment_path)} continues it")
        return INTERRUPTED
    return FAILED if errors else OK


def print_best_result(results: Any, metric: str | None, mode: str | None) -> None:
    from ray_stagetree.jobs.experiments import config_text

    if metric is None or mode is None:
        return
    try:
        best = results.get_best_result()
    except RuntimeError:  # no trial reported the metric (all errored, or interrupted early)
        print(f"best: - (no trial reported {metric!r})")
        return
    trial = best.path.rstrip("/").rsplit("/", 1)[-1]
    print(f"best ({mode} {metric}, last result): {number(best.metrics.get(metric))} in {trial}")
    print(f"  config: {config_text(best.config)}")


def print_best(experiment: Any, args: argparse.Namespace) -> None:
    from ray_stagetree.jobs.experiments import config_text

    metric, mode = experiment.metric_and_mode(args.metric, args.mode)
    best = experiment.best(metric, mode)
    if best is None:
        print(
            "best: -" + ("" if metric and mode else " (the study names no metric and mode: pass --metric and --mode)")
        )
        return
    print(
        f"best ({mode} {metric}, last result): {number(best.last[metric])} at iteration {best.iterations} "
        f"of {best.dirname}"
    )
    print(f"  config: {config_text(best.config)}")


def open_experiment(path: str) -> Any:
    from ray_stagetree.jobs.experiments import read_experiment

    try:
        from ray_stagetree.planning.filesystems import absolute_path

        return read_experiment(absolute_path(path))
    except FileNotFoundError as error:
        raise CommandError(str(error)) from None


def latest_experiment(storage_path: str | None) -> Any:
    """The experiment started last under ``storage_path`` (default: where `run` puts them)."""
    from ray_stagetree.jobs.experiments import list_experiments

    storage = storage_path or default_storage()
    try:
        experiments = list_experiments(storage)
    except FileNotFoundError as error:
        raise CommandError(f"{error}: pass an experiment folder, or --storage-path") from None
    if not experiments:
        raise CommandError(f"no ray_stagetree experiments in {storage}: pass an experiment folder, or --storage-path")
    return experiments[-1]


def default_storage() -> str:
    """Where `run` puts a spec's experiment without a storage path: Tune's
    default (``~/ray_results``), read when asked, as ``RunConfig`` reads it."""
    import ray.train.constants

    return str(ray.train.constants.DEFAULT_STORAGE_PATH)


def no_plan(path: str) -> Any:
    raise CommandError(f"--cost-from {path!r}: the study has no plan yet (it is written when a study ends)")


def number(value: Any) -> str:
    return "-" if value is None else short(value)


def quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def print_table(header: list[str], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) + "  " + str(row[-1]))
