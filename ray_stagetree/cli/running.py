"""``stagetree run``, ``restore`` and ``submit``: a study started, continued
or sent to a cluster, from its job spec."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ray_stagetree.cli.common import (
    FAILED,
    INTERRUPTED,
    OK,
    TOKEN_HELP,
    CommandError,
    check_no_other_driver,
    default_name,
    finish,
    fit,
    load_spec,
    quote,
    save_job,
    saved_job,
    start_ray,
)


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    name = args.name or default_name(spec.data, args.spec)
    path = spec.experiment_path(storage_path=args.storage_path, name=name)
    if _claim_folder(path, args) == RESUME:
        return _continue(path, spec, args)
    start_ray(args)
    tuner = spec.tuner(storage_path=args.storage_path, name=name)
    path = tuner.experiment_path  # the Tuner's own rule: storage_path (default ~/ray_results) / name
    save_job(path, spec)
    print(f"stagetree: running {args.spec} in {path}", flush=True)
    return finish(fit(tuner), spec.tune_config)


def restore(args: argparse.Namespace) -> int:
    from ray_stagetree.planning.filesystems import absolute_path
    from ray_stagetree.runtime.driver.tuner import Tuner

    path = absolute_path(args.path)
    if not Tuner.can_restore(path):
        raise CommandError(
            f"{args.path!r} is not a ray_stagetree experiment directory that can be restored "
            "(no stagetree_tuner.pkl): pass the folder `stagetree run` printed"
        )
    spec = load_spec(args.spec) if args.spec else saved_job(path)
    return _continue(path, spec, args)


def _continue(path: str, spec: Any, args: argparse.Namespace) -> int:
    """Continue the study at ``path`` (`restore`, and `run --resume`), with
    `restore`'s options where ``args`` has them."""
    from ray_stagetree.runtime.driver.tuner import Tuner

    check_no_other_driver(path)  # before Ray starts; fit() takes the folder's lease
    start_ray(args)
    tuner = Tuner.restore(
        path,
        spec.trainable(),
        resume_unfinished=not getattr(args, "no_resume_unfinished", False),
        resume_errored=getattr(args, "resume_errored", False),
        restart_errored=getattr(args, "restart_errored", False),
    )
    print(f"stagetree: continuing {path}", flush=True)
    return finish(fit(tuner), spec.tune_config)


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
        f"Pass --resume to continue it (as `stagetree restore {quote(path)}` does), --overwrite to delete it and "
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


def submit(args: argparse.Namespace) -> int:
    from ray.job_submission import JobStatus, JobSubmissionClient

    from ray_stagetree.jobs.spec import checked_storage_path

    spec_path = os.path.abspath(args.spec)
    spec = load_spec(spec_path)  # refuse a bad spec here, not on the cluster
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
        [args.python, "-m", "ray_stagetree.cli", "run", quote(relative)]
        + (["--storage-path", quote(args.storage_path)] if args.storage_path else [])
        + (["--name", quote(args.name)] if args.name else [])
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


#: What `_claim_folder` decided: the run starts in a free folder, or continues the one there.
FRESH, RESUME = "fresh", "resume"
