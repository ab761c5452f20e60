"""``stagetree``: run, submit, plan and inspect studies described by job specs.

One function per subcommand (``_run``, ``_plan``, ...), each taking the
parsed arguments and returning the exit code; `SUBCOMMANDS` lists them, so
a new one is a function and an entry there.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from ray_stagetree._extras import MissingExtraError, require
from ray_stagetree.jobs.errors import SpecError
from ray_stagetree.monitor.options import add_arguments as add_monitor_arguments
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


# -- subcommands ----------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    spec = _load(args.spec)
    name = args.name or _default_name(spec.data, args.spec)
    path = spec.experiment_path(storage_path=args.storage_path, name=name)
    if _claim_folder(path, args) == RESUME:
        return _continue(path, spec, args)
    _start_ray(args)
    tuner = spec.tuner(storage_path=args.storage_path, name=name)
    path = tuner._experiment_path()  # the Tuner's own rule: storage_path (default ~/ray_results) / name
    _save_job(path, spec)
    print(f"stagetree: running {args.spec} in {path}", flush=True)
    return _finish(_fit(tuner), spec.tune_config)


def _restore(args: argparse.Namespace) -> int:
    from ray_stagetree.planning.filesystems import absolute_path
    from ray_stagetree.runtime.driver.tuner import Tuner

    path = absolute_path(args.path)
    if not Tuner.can_restore(path):
        raise CommandError(
            f"{args.path!r} is not a ray_stagetree experiment directory that can be restored "
            "(no stagetree_tuner.pkl): pass the folder `stagetree run` printed"
        )
    spec = _load(args.spec) if args.spec else _saved_job(path)
    return _continue(path, spec, args)


def _continue(path: str, spec: Any, args: argparse.Namespace) -> int:
    """Continue the study at ``path`` (`restore`, and `run --resume`), with
    `restore`'s options where ``args`` has them."""
    from ray_stagetree.runtime.driver.tuner import Tuner

    _check_no_other_driver(path)  # before Ray starts; fit() takes the folder's lease
    _start_ray(args)
    tuner = Tuner.restore(
        path,
        spec.trainable(),
        resume_unfinished=not getattr(args, "no_resume_unfinished", False),
        resume_errored=getattr(args, "resume_errored", False),
        restart_errored=getattr(args, "restart_errored", False),
    )
    print(f"stagetree: continuing {path}", flush=True)
    return _finish(_fit(tuner), spec.tune_config)


#: What `_claim_folder` decided: the run starts in a free folder, or continues the one there.
FRESH, RESUME = "fresh", "resume"


def _claim_folder(path: str, args: argparse.Namespace) -> str:
    """Whether `run` starts fresh in ``path`` or continues the experiment
    there (``--resume``). A second run of a spec never writes into the first
    one's folder: its trials would mix with the new ones (and `status` would
    count both). Tune's choices: resume it, or start over (``--overwrite``
    deletes it); else the user picks another ``--name``.

    Raises CommandError when ``path`` holds something and neither was asked."""
    from ray_stagetree.jobs.experiments import is_experiment
    from ray_stagetree.planning.filesystems import resolve
    from ray_stagetree.runtime.driver.tuner import Tuner

    filesystem, root = resolve(path)
    if not _holds_a_run(filesystem, root):
        if args.resume:
            print(f"stagetree: nothing to resume in {path}: starting the study there", flush=True)
        return FRESH
    is_study = is_experiment(filesystem, root)
    if args.resume and Tuner.can_restore(path):
        return RESUME
    if args.overwrite and is_study:
        filesystem.rm(root, recursive=True)
        print(f"stagetree: deleted the earlier experiment in {path} (--overwrite)", flush=True)
        return FRESH
    if not is_study:
        raise CommandError(
            f"{path} holds files that are not a ray_stagetree experiment; the study would write among them. "
            "Pass --name with another folder name (or --storage-path)"
        )
    if args.resume:
        raise CommandError(
            f"the experiment in {path} cannot be continued (its driver stopped before it saved its settings): "
            "pass --overwrite to delete it and start again, or --name with another folder name"
        )
    raise CommandError(
        f"{path} already holds an experiment of this name; a second run would mix its trials with the new ones. "
        f"Pass --resume to continue it (as `stagetree restore {_quote(path)}` does), --overwrite to delete it and "
        "start again, or --name with another folder name"
    )


def _holds_a_run(filesystem: Any, root: str) -> bool:
    """Whether the folder holds anything a study wrote, beyond the settings
    file a Tuner writes when it is built (a Python ``Tuner()`` never fitted,
    or a dry run of an earlier version): those trained nothing."""
    from ray_stagetree.runtime.control.experiment_state import TUNER_FILE

    if not filesystem.isdir(root):
        return False
    names = {entry.rstrip("/").rsplit("/", 1)[-1] for entry in filesystem.ls(root, detail=False)}
    return bool(names - {TUNER_FILE})


def _submit(args: argparse.Namespace) -> int:
    from ray.job_submission import JobStatus, JobSubmissionClient

    from ray_stagetree.jobs.spec import checked_storage_path

    spec_path = os.path.abspath(args.spec)
    spec = _load(spec_path)  # refuse a bad spec here, not on the cluster
    if args.storage_path:
        checked_storage_path(args.storage_path, "--storage-path", spec.source)
    working_dir = os.path.abspath(args.working_dir)
    relative = os.path.relpath(spec_path, working_dir)
    if relative.startswith(".."):
        raise CommandError(
            f"the spec {args.spec!r} must be inside the working directory {working_dir!r} "
            "(--working-dir), which is what the cluster receives"
        )
    runtime_env: dict[str, Any] = {"working_dir": working_dir}
    requirements = args.requirements or os.path.join(working_dir, "requirements.txt")
    if args.requirements and not os.path.isfile(args.requirements):
        raise CommandError(f"--requirements {args.requirements!r}: no such file")
    if os.path.isfile(requirements):
        runtime_env["pip"] = os.path.abspath(requirements)
    entrypoint = " ".join(
        [args.python, "-m", "ray_stagetree.cli", "run", _quote(relative)]
        + (["--storage-path", _quote(args.storage_path)] if args.storage_path else [])
        + (["--name", _quote(args.name)] if args.name else [])
        + (["--resume"] if args.resume else [])
        + (["--overwrite"] if args.overwrite else [])
    )
    try:
        client = JobSubmissionClient(args.address)
        job_id = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
    except Exception as error:  # connection and HTTP errors come in many types
        message = f"cannot submit to {args.address!r}: {type(error).__name__}: {error}"
        if type(error).__name__ == "AuthenticationError":
            message = f"cannot submit to {args.address!r}: the cluster asks for its token. {TOKEN_HELP}"
        raise CommandError(message, FAILED) from None
    print(f"stagetree: submitted {args.spec} as job {job_id!r} to {args.address} ({entrypoint})", flush=True)
    if args.no_wait:
        print(f"follow it with: ray job logs --address {args.address} --follow {job_id}")
        return OK
    import asyncio

    async def tail() -> None:
        async for lines in client.tail_job_logs(job_id):
            print(lines, end="", flush=True)

    asyncio.run(tail())
    status = client.get_job_status(job_id)
    print(f"stagetree: job {job_id!r} {status}")
    return {JobStatus.SUCCEEDED: OK, JobStatus.STOPPED: INTERRUPTED}.get(status, FAILED)


def _plan(args: argparse.Namespace) -> int:
    from ray_stagetree.jobs.dry_run import draw_picture, draw_text, dry_run, hours
    from ray_stagetree.jobs.experiments import cost_model
    from ray_stagetree.planning.cost import CostModel

    if args.draw:  # before the dry run, not after it
        require("matplotlib", "stagetree plan --draw", "monitor")
    spec = _load(args.spec)
    cost = CostModel(default_seconds_per_iteration=args.seconds_per_iteration)
    calibration = f"{args.seconds_per_iteration:g} s per iteration"
    if args.cost_from:
        timed = _read_experiment(args.cost_from).plan or _no_plan(args.cost_from)
        try:
            cost = cost_model(timed)
        except ValueError as error:
            raise CommandError(f"--cost-from {args.cost_from!r}: {error}") from None
        calibration = f"seconds per iteration fitted to {args.cost_from}"
    try:
        result = dry_run(spec, cost, horizon=args.horizon, samples=args.samples)
    except (TypeError, ValueError) as error:  # a drawn trial's config is invalid, or no horizon
        raise CommandError(str(error)) from None
    if args.json:
        print(
            json.dumps(
                {
                    "trials": len(result.trials),
                    "horizon": result.horizon,
                    "sampled": result.sampled,
                    "merge_rate": result.merge_rate,
                    "unique_iterations": result.unique_iterations,
                    "trial_by_trial_iterations": result.total_iterations,
                    "stages": len(result.tree.stages),
                    "worker_hours": result.shared_seconds / 3600,
                    "trial_by_trial_worker_hours": result.trial_by_trial_seconds / 3600,
                    "makespan_bound_hours": result.makespan_bound(args.workers) / 3600,
                    "workers": args.workers,
                },
                indent=2,
            )
        )
    else:
        origin = (
            "drawn at random from the space (the searcher's own depend on results)"
            if result.sampled
            else "as the study draws them"
        )
        print(f"{len(result.trials)} trials of {result.horizon} iterations, {origin}")
        print(
            f"merge rate {result.merge_rate:.2f}: {result.unique_iterations} unique iterations, "
            f"{result.total_iterations} trial by trial"
        )
        print(f"stage tree: {len(result.tree.stages)} stages\n")
        print(draw_text(result.tree, args.max_lines))
        print(
            f"\nestimated worker-hours ({calibration}): {hours(result.shared_seconds)} with stage sharing, "
            f"{hours(result.trial_by_trial_seconds)} trial by trial"
        )
        print(
            f"on {args.workers} worker{'s' if args.workers != 1 else ''}: no schedule ends in under "
            f"{hours(result.makespan_bound(args.workers))} hours"
        )
    if args.draw:
        draw_picture(result.tree, args.draw, result.horizon)
        print(f"stage tree drawn in {args.draw}", file=sys.stderr if args.json else sys.stdout)
    return OK


def _status(args: argparse.Namespace) -> int:
    from ray_stagetree.jobs.experiments import age

    experiment = _read_experiment(args.path) if args.path else _latest_experiment(args.storage_path)
    counts = experiment.counts()
    state = "ended" if experiment.ended else "running, or stopped before its end (stagetree restore continues it)"
    print(f"{experiment.path}: {state}; last update {age(experiment.last_update)}")
    print("trials: " + (", ".join(f"{count} {status}" for status, count in sorted(counts.items())) or "none yet"))
    trained = experiment.trained()
    if trained:
        # Unique iterations: a `run` line's "executed" also counts what a restore trained again.
        print(f"trained {trained[0]} unique iterations in {trained[1]:.1f} worker-seconds")
    _print_best(experiment, args)
    return OK


def _show(args: argparse.Namespace) -> int:
    from ray_stagetree.jobs.experiments import config_text

    experiment = _read_experiment(args.path) if args.path else _latest_experiment(args.storage_path)
    args.path = experiment.path  # the status that follows is this experiment's
    metric, mode = experiment.metric_and_mode(args.metric, args.mode)
    if args.json:
        print(
            json.dumps(
                {
                    "path": experiment.path,
                    "ended": experiment.ended,
                    "metric": metric,
                    "mode": mode,
                    "trials": [
                        {
                            "trial": trial.dirname,
                            "status": trial.status,
                            "iterations": trial.iterations,
                            "config": trial.config,
                            "last_result": trial.last,
                            "error": trial.error,
                        }
                        for trial in experiment.trials
                    ],
                },
                indent=2,
                default=str,
            )
        )
        return OK
    rows = [
        (
            trial.dirname,
            trial.status,
            str(trial.iterations),
            _number(trial.last.get(metric)),
            trial.error or config_text(trial.config),
        )
        for trial in experiment.trials
    ]
    _print_table(["trial", "status", "iter", metric or "metric", "config (or error)"], rows)
    return _status(args)


def _ls(args: argparse.Namespace) -> int:
    from ray_stagetree.jobs.experiments import age, list_experiments
    from ray_stagetree.planning.lifecycle import ERROR

    storage = args.storage_path or _default_storage()
    try:
        experiments = list_experiments(storage)
    except FileNotFoundError as error:
        raise CommandError(str(error)) from None
    rows = []
    for experiment in experiments:
        metric, mode = experiment.metric_and_mode()
        best = experiment.best(metric, mode)
        counts = experiment.counts()
        rows.append(
            (
                experiment.path.rstrip("/").rsplit("/", 1)[-1],
                "ended" if experiment.ended else "not ended",
                str(len(experiment.trials)),
                str(counts.get(ERROR, 0)),
                f"{metric}={_number(best.last[metric])}" if best else "-",
                age(experiment.last_update),
            )
        )
    if not rows:
        print(f"no ray_stagetree experiments in {storage}")
        return OK
    _print_table(["experiment", "state", "trials", "errors", "best", "updated"], rows)
    return OK


def _monitor(args: argparse.Namespace) -> int:
    from ray_stagetree.monitor.__main__ import run

    run(args, args.subparser)
    return OK


SUBCOMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _run,
    "submit": _submit,
    "plan": _plan,
    "status": _status,
    "show": _show,
    "ls": _ls,
    "restore": _restore,
    "monitor": _monitor,
}


# -- shared pieces --------------------------------------------------------------------


def _load(path: str) -> Any:
    from ray_stagetree.jobs.spec import JobSpec

    return JobSpec.from_file(path)


def _start_ray(args: argparse.Namespace) -> None:
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


def _default_name(data: dict[str, Any], spec_path: str) -> str | None:
    """The spec's name, else the spec file's name and the time, so the
    experiment's folder is known before it starts (its job file goes there)."""
    if data.get("run_config", {}).get("name"):
        return None
    stem = os.path.splitext(os.path.basename(spec_path))[0]
    return f"{stem}_{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}"


def _save_job(path: str, spec: Any) -> None:
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


def _saved_job(path: str) -> Any:
    """The spec `_save_job` left beside the study, if this machine's key for
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


def _check_no_other_driver(path: str) -> None:
    """A study another driver runs is not continued a second time into its folder."""
    from ray_stagetree.execution.storage import CheckpointStorage
    from ray_stagetree.runtime.driver.lease import ExperimentInUseError, check_free

    try:
        check_free(CheckpointStorage(path), path)
    except ExperimentInUseError as error:
        raise CommandError(str(error), FAILED) from None


def _fit(tuner: Any) -> Any:
    """``tuner.fit()``; what it refuses (a drawn config that cannot run, resources
    the cluster lacks, storage other nodes cannot see) becomes a message. An
    interrupted study's message says how this command line continues it."""
    from ray_stagetree.runtime.driver.tuner import restore_hint

    try:
        with restore_hint(lambda path: f"stagetree restore {_quote(path)}"):
            return tuner.fit()
    except (TypeError, ValueError, RuntimeError, OSError) as error:
        raise CommandError(f"the study could not run: {error}", FAILED) from None


def _finish(results: Any, tune_config: Any) -> int:
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
    _print_best_result(results, tune_config.metric, tune_config.mode)
    executed, trial_by_trial = results.iterations_executed, results.trial_by_trial_iterations
    if unfinished:  # the remaining iterations are neither executed nor counted: no saving to claim yet
        print(f"iterations executed so far: {executed} (partial: the study stopped before its end)")
    else:
        print(f"iterations executed: {executed}; trial by trial: {trial_by_trial}")
    print(f"experiment: {results.experiment_path}  (stagetree show {_quote(results.experiment_path)})")
    if unfinished:
        print(f"stopped early: stagetree restore {_quote(results.experiment_path)} continues it")
        return INTERRUPTED
    return FAILED if errors else OK


def _print_best_result(results: Any, metric: str | None, mode: str | None) -> None:
    from ray_stagetree.jobs.experiments import config_text

    if metric is None or mode is None:
        return
    try:
        best = results.get_best_result()
    except RuntimeError:  # no trial reported the metric (all errored, or interrupted early)
        print(f"best: - (no trial reported {metric!r})")
        return
    trial = best.path.rstrip("/").rsplit("/", 1)[-1]
    print(f"best ({mode} {metric}, last result): {_number(best.metrics.get(metric))} in {trial}")
    print(f"  config: {config_text(best.config)}")


def _print_best(experiment: Any, args: argparse.Namespace) -> None:
    from ray_stagetree.jobs.experiments import config_text

    metric, mode = experiment.metric_and_mode(args.metric, args.mode)
    best = experiment.best(metric, mode)
    if best is None:
        print(
            "best: -" + ("" if metric and mode else " (the study names no metric and mode: pass --metric and --mode)")
        )
        return
    print(
        f"best ({mode} {metric}, last result): {_number(best.last[metric])} at iteration {best.iterations} "
        f"of {best.dirname}"
    )
    print(f"  config: {config_text(best.config)}")


def _read_experiment(path: str) -> Any:
    from ray_stagetree.jobs.experiments import read_experiment

    try:
        from ray_stagetree.planning.filesystems import absolute_path

        return read_experiment(absolute_path(path))
    except FileNotFoundError as error:
        raise CommandError(str(error)) from None


def _latest_experiment(storage_path: str | None) -> Any:
    """The experiment updated last under ``storage_path`` (default: where `run` puts them)."""
    from ray_stagetree.jobs.experiments import list_experiments

    storage = storage_path or _default_storage()
    try:
        experiments = list_experiments(storage)
    except FileNotFoundError as error:
        raise CommandError(f"{error}: pass an experiment folder, or --storage-path") from None
    if not experiments:
        raise CommandError(f"no ray_stagetree experiments in {storage}: pass an experiment folder, or --storage-path")
    return experiments[-1]


def _default_storage() -> str:
    """Where `run` puts a spec's experiment without a storage path: Tune's
    default (``~/ray_results``), read when asked, as ``RunConfig`` reads it."""
    import ray.train.constants

    return str(ray.train.constants.DEFAULT_STORAGE_PATH)


def _no_plan(path: str) -> Any:
    raise CommandError(f"--cost-from {path!r}: the study has no plan yet (it is written when a study ends)")


def _number(value: Any) -> str:
    return "-" if value is None else short(value)


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _print_table(header: list[str], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) + "  " + str(row[-1]))


# -- arguments ------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    """The ``stagetree`` argument parser, one sub-parser per subcommand."""
    main = argparse.ArgumentParser(
        prog="stagetree",
        description="Run, submit, plan and inspect ray_stagetree studies described by a job spec (YAML or JSON).",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = main.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name, help=help, description=help, epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter
        )

    def ray_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--address",
            help="Ray cluster to join ('local' starts a new one); default: RAY_ADDRESS, "
            "else the latest `ray start` on this machine, else a local Ray",
        )
        sub.add_argument("--num-cpus", type=int, help="CPUs of a Ray started locally (default: every core)")

    def experiment_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--storage-path", help="where the experiment folder goes (overrides run_config.storage_path)")
        sub.add_argument("--name", help="the experiment folder's name (overrides run_config.name)")
        again = sub.add_mutually_exclusive_group()
        again.add_argument(
            "--resume",
            action="store_true",
            help="if the folder holds this study already, continue it (as `stagetree restore`); else start it",
        )
        again.add_argument(
            "--overwrite",
            action="store_true",
            help="if the folder holds an experiment already, delete it and start again",
        )

    run = command("run", "run the study a spec describes, here")
    run.add_argument("spec", help="the job spec (.yaml, .yml or .json)")
    experiment_options(run)
    ray_options(run)

    submit = command(
        "submit",
        "run the study on a Ray cluster through Ray Jobs (working directory and "
        "requirements.txt shipped as its runtime environment)",
    )
    submit.add_argument("spec", help="the job spec, inside the working directory")
    submit.add_argument("--address", required=True, help="the cluster's Ray Jobs address, e.g. http://head:8265")
    submit.add_argument("--working-dir", default=".", help="folder shipped to the cluster (default: this one)")
    submit.add_argument(
        "--requirements",
        help="pip requirements file for the job (default: requirements.txt in "
        "the working directory, when there is one)",
    )
    submit.add_argument("--python", default="python", help="the Python command on the cluster (default: python)")
    submit.add_argument("--no-wait", action="store_true", help="return once submitted instead of following the logs")
    experiment_options(submit)

    plan = command(
        "plan", "dry run: trials, merge rate, the stage tree (text, and --draw for a picture), estimated worker-hours"
    )
    plan.add_argument("spec", help="the job spec")
    plan.add_argument("--horizon", type=_positive_int, help="iterations per trial, when the spec sets none")
    plan.add_argument(
        "--samples", type=_positive_int, help="trials to plan for a searcher or num_samples=-1 (default: num_samples)"
    )
    plan.add_argument(
        "--seconds-per-iteration",
        type=_positive_float,
        default=1.0,
        help="cost of one iteration for the estimate (default: 1)",
    )
    plan.add_argument(
        "--cost-from", metavar="EXPERIMENT", help="fit the cost model to the timings of an ended study instead"
    )
    plan.add_argument("--workers", type=_positive_int, default=1, help="workers for the wall-time bound (default: 1)")
    plan.add_argument(
        "--draw", metavar="FILE", type=_picture_path, help="also draw the stage tree to FILE (.svg, .png or .pdf)"
    )
    plan.add_argument("--max-lines", type=_positive_int, default=200, help="stages drawn as text (default: 200)")
    plan.add_argument("--json", action="store_true", help="figures as JSON instead of text")

    for name, help in (
        ("status", "how a study stands: trials by status, what was trained, the best result"),
        ("show", "a study's trials table, then its status"),
    ):
        sub = command(name, help)
        sub.add_argument(
            "path",
            nargs="?",
            help="the experiment folder (local path or URI; default: the latest one under --storage-path)",
        )
        sub.add_argument("--storage-path", help="where to look for the latest experiment (default: ~/ray_results)")
        sub.add_argument("--metric", help="metric ranking the trials (default: the spec's)")
        sub.add_argument("--mode", choices=("min", "max"), help="whether the metric is minimised or maximised")
        if name == "show":
            sub.add_argument("--json", action="store_true", help="the trials as JSON")

    ls = command("ls", "the experiments in a storage folder")
    ls.add_argument("storage_path", nargs="?", help="folder holding experiments (default: ~/ray_results)")

    restore = command("restore", "continue a study that stopped (Ctrl-C, a lost driver) from its experiment folder")
    restore.add_argument("path", help="the experiment folder")
    restore.add_argument("--spec", help="the job spec (default: the copy `stagetree run` saved in the folder)")
    restore.add_argument(
        "--resume-errored", action="store_true", help="run errored trials again from their latest checkpoint"
    )
    restore.add_argument("--restart-errored", action="store_true", help="start errored trials' results over")
    restore.add_argument("--no-resume-unfinished", action="store_true", help="end unfinished trials where they stood")
    ray_options(restore)

    monitor = command(
        "monitor",
        "serve a live web page of a study (running or ended): trials, learning curves, "
        "stage tree, workers; Ctrl-C stops it",
    )
    add_monitor_arguments(monitor)
    monitor.set_defaults(subparser=monitor)  # the monitor reports a bad port or path as its usage error
    return main


def _positive(kind: type, what: str) -> Callable[[str], Any]:
    """An argparse type: ``kind(text)``, refused unless > 0, naming the value."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


_positive_int = _positive(int, "an int >= 1")
_positive_float = _positive(float, "a number > 0")


def _picture_path(text: str) -> str:
    if os.path.splitext(text)[1].lower() not in (".svg", ".png", ".pdf"):
        raise argparse.ArgumentTypeError(f"must end in .svg, .png or .pdf, got {text!r}")
    return text


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``stagetree`` console script; returns the exit code."""
    args = parser().parse_args(argv)
    try:
        return SUBCOMMANDS[args.command](args)
    except SpecError as error:
        print(f"stagetree: error: {error}", file=sys.stderr)
        return USAGE
    except CommandError as error:
        print(f"stagetree: error: {error}", file=sys.stderr)
        return error.code
    except MissingExtraError as error:
        print(f"stagetree: error: {error}", file=sys.stderr)
        return FAILED
    except KeyboardInterrupt:
        print("stagetree: interrupted", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
