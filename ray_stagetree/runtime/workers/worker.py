"""Stage workers: long-lived Ray actors that run stage batches.

A worker receives a `BatchSpec` (the config of the batch's deepest plan node,
which describes the whole path; the checkpoint to start from; the segments
to train; the iterations to checkpoint at), runs the user's trainable through it
and streams records back to the controller in small batches: metrics of
every iteration, checkpoints where asked. The controller's reply to a flush
can add checkpoint iterations (a trial arrived that forks here), move the end
of the batch earlier (no live trial needs the rest), or, at the batch's end,
later: the trial goes on, and so does the live function (live continuation).
Class trainables run through `ray_stagetree.runtime.workers.class_trainables`.

Each trainable runs in a thread of its own (`LiveTrainable`). A trial paused
where its trainable keeps no checkpoint (synchronous HyperBand) would have to
train again from scratch when resumed; instead the controller has the
trainable park: the batch ends, the worker takes other batches, and the
trainable waits, alive, for the batch that continues it or for its release.

A checkpoint waits in the worker's outbox until the controller calls
`StageWorker.take_checkpoint`: the payload becomes that call's return value,
an object the controller owns, so it outlives this worker, and its bytes go
from this process to the object store without passing through anyone else.
Workers are threaded actors so that call is served while a batch runs.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import numbers
import os
import queue
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Sequence
from typing import Any

import ray

from ray_stagetree.execution import working_dirs
from ray_stagetree.execution.batches import BatchOutcome, BatchSpec
from ray_stagetree.execution.payload import CheckpointPayload
from ray_stagetree.execution.rng import seed_everything
from ray_stagetree.execution.scaling import Scaling
from ray_stagetree.runtime.workers import (
    parameters,
    scratch,
    session,
    train_runs,
    trial_output,
    trial_workdir,
    user_generators,
)
from ray_stagetree.runtime.workers.class_trainables import KEPT, run_class
from ray_stagetree.runtime.workers.context import (
    BatchEnd,
    ConfigChange,
    ReportError,
    StageContext,
    activate,
    current,
    worker_facts,
)
from ray_stagetree.runtime.workers.group import PeerContext, Peers, RankGroup, RankInfo
from ray_stagetree.runtime.workers.kept_process import modules_changed_since
from ray_stagetree.runtime.workers.remote import remote_once
from ray_stagetree.runtime.workers.reproducibility import seed_stage
from ray_stagetree.runtime.workers.trial_errors import pack_error
from ray_stagetree.trainables import live as live_values
from ray_stagetree.trial_schedulers.ray_fields import treat_as_tune_session, use_trial_logdir


def run_function(trainable: Callable, context: StageContext) -> None:
    """Run the function through the batch. It ends at the batch's last
    iteration (`report` raises `BatchEnd`), restarts where PBT changed a plain
    config value, and may return early, which ends the trials it serves."""
    activate(context)
    context.hparams_root = getattr(trainable, "__stagetree_hparams_root__", "")
    try:
        while True:
            context.user_generators.new_run()
            try:
                if inspect.isgeneratorfunction(trainable):  # Tune reports each value yielded
                    for output in trainable(context.trainable_config()):
                        _report_output(context, output)
                else:
                    _report_output(context, trainable(context.trainable_config()))
            except ConfigChange:
                continue
            except BatchEnd:
                return
            break
    finally:
        activate(None)
    if context.iteration < context.stop:
        context.returned_at = context.iteration


def _report_output(context: StageContext, output: Any) -> None:
    """What a function trainable returned (or yielded), reported as Tune's
    function wrapper reports it: a dict as one more result, a number as
    ``{"_metric": number}``, nothing for a falsy value."""
    from ray.tune.result import DEFAULT_METRIC

    if not output:
        return
    if isinstance(output, dict):
        context.report(output)
    elif isinstance(output, numbers.Number):
        context.report({DEFAULT_METRIC: output})
    else:  # Tune's error and type
        raise ValueError(  # noqa: TRY004
            "Invalid return or yield value. Either return/yield a single number or a dictionary object in your "
            "trainable function."
        )


def _name(trainable: Any) -> str:
    return getattr(trainable, "__name__", type(trainable).__name__)


def _load_error_message(error: Exception) -> str:
    missing = f"module {error.name!r}" if isinstance(error, ModuleNotFoundError) and error.name else "a module"
    return (
        f"the stage workers cannot load the trainable ({type(error).__name__}: {error}). Ray workers import "
        f"the modules a trainable was defined in by name, and {missing} is not importable on them. Make it "
        "importable on every worker: ray.init(runtime_env={'working_dir': '.'}) or "
        "runtime_env={'py_modules': [...]} for code next to the script or notebook (a sys.path change in the "
        "driver does not reach workers), or install the package on the cluster"
    )


def _sequence_hint(error: Exception) -> str:
    """A pointer to get_hparams() when code used a sequence as a plain value."""
    from ray_stagetree.sequences import FAMILIES

    if isinstance(error, TypeError) and any(f"'{family}'" in str(error) for family in FAMILIES):
        return (
            "\nHint: config values that are sequences are objects, not numbers; read this "
            "iteration's value with ray_stagetree.get_hparams()[name] (or StageTrainable.update_hparams)."
        )
    return ""


def _install_tune_shims() -> None:
    """Make Tune's own ``report`` / ``get_checkpoint`` (``ray.tune`` and
    ``ray.train``) ours in this worker process. Outside a Tune session they
    silently do nothing, so an unported ``while True: tune.report(...)``
    trainable would spin forever; with the shims it simply works."""
    import ray.train
    import ray.tune

    for module in (ray.tune, ray.train):
        module.report = session.report
        module.get_checkpoint = session.get_checkpoint
        module.get_context = session.get_context
    use_trial_logdir(ray.tune.Trainable, trial_workdir.current)
    # Ray's integrations ask it whether they run in a Tune trial (``setup_mlflow``
    # then names its experiment after the trial, as under Tune). Patched before the
    # trainable's modules import it by name.
    treat_as_tune_session(lambda: current() is not None)
    # setup_wandb takes its default run id, name and group from Ray Train's session, which it
    # imported by name: as under Tune, they are the trial's id and name and the experiment's name.
    _refuse_legacy_train_runs()
    train_runs.host(current, _when_imported)
    live_values.use_stage_context(current)
    parameters.keep_resident(current)
    # Ray's framework callbacks are ours (subclasses, same arguments): a script written for Tune shares as written.
    for ray_module, name, ours in FRAMEWORK_CALLBACKS:
        _when_imported(ray_module, functools.partial(_use_our_callback, name=name, ours=ours))
    _when_imported("torch", lambda torch: user_generators.track_torch(torch, _user_generators))
    _when_imported("numpy", lambda numpy: user_generators.track_numpy(numpy, _user_generators))
    from ray.air.integrations import wandb as wandb_integration

    train_session = wandb_integration.get_session
    wandb_integration.get_session = lambda: (
        session.StageTrainSession(current()) if current() is not None else train_session()
    )


#: Ray's callbacks for training frameworks, and the modules of ours that replace them on a stage worker.
FRAMEWORK_CALLBACKS = (
    ("ray.tune.integration.pytorch_lightning", "TuneReportCheckpointCallback", "ray_stagetree.trainables.lightning"),
    ("ray.train.huggingface.transformers", "RayTrainReportCallback", "ray_stagetree.trainables.transformers"),
)


def _use_our_callback(module: types.ModuleType, name: str, ours: str) -> None:
    """Ray's class ``name`` makes instances of our subclass. (Not a swap of the
    module's name: Ray's ``__init__`` finds its class by that name for ``super()``.)"""
    ray_class = getattr(module, name)

    def new(cls: type, *args: Any, **kwargs: Any) -> Any:
        # Ours imports Ray's module: it is looked up at the first instance, not while Ray's module loads.
        return object.__new__(getattr(importlib.import_module(ours), name) if cls is ray_class else cls)

    ray_class.__new__ = staticmethod(new)


def _user_generators() -> user_generators.UserGenerators | None:
    """The generators tracker of the trainable running on this thread, if any."""
    context = current()
    return None if context is None else context.user_generators


#: How often rank 0 of a data-parallel group looks whether a peer failed while its own rank trains.
PEER_POLL_S = 0.5
#: How long `StageWorker.close` lets the trainables it ends run their cleanup.
CLOSE_WAIT_S = 2.0


class NestedTrainRunError(RuntimeError):
    """A trainable started a Ray Train run on the legacy engine (a trainer's ``fit()``)."""


NESTED_TRAIN_RUN = (
    "{trainer}.fit() was called inside a trial that ray_stagetree runs, on Ray Train's legacy engine "
    "(RAY_TRAIN_V2_ENABLED=0), where it would start a Tune run of its own whose workers nobody counts and whose "
    "iterations stage sharing cannot see. Use a form that trains data-parallel on shared stages: "
    "ray_stagetree.Tuner(train_loop_per_worker, scaling_config=ScalingConfig(...)), or "
    "Tuner(TorchTrainer(train_loop_per_worker, scaling_config=...), param_space={{'train_loop_config': ...}}); "
    "under Train v2 (Ray's default) this driver function runs as it is"
)


def _refuse_legacy_train_runs() -> None:
    """A legacy Ray Train trainer's ``fit()`` raises `NestedTrainRunError`
    in a trial run here (it still runs outside one: a trainable may be
    tested by calling it). Train v2's runs (`train_runs`)."""

    def refuse(imported: types.ModuleType) -> None:
        trainer_class = imported.BaseTrainer
        fit = trainer_class.fit

        @functools.wraps(fit)
        def refusing_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
            if current() is not None:
                raise NestedTrainRunError(NESTED_TRAIN_RUN.format(trainer=type(self).__name__))
            return fit(self, *args, **kwargs)

        trainer_class.fit = refusing_fit

    _when_imported("ray.train.base_trainer", refuse)


def _when_imported(name: str, patch: Callable[[types.ModuleType], None]) -> None:
    """Call ``patch`` with module ``name`` once it is imported: now if it is."""
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _PatchOnImport(name, patch))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds one module as Python would, and patches it once it executed."""

    def __init__(self, name: str, patch: Callable[[types.ModuleType], None]) -> None:
        self._name, self._patch = name, patch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            execute = spec.loader.exec_module

            def execute_and_patch(module: types.ModuleType) -> None:
                execute(module)
                self._patch(module)

            spec.loader.exec_module = execute_and_patch  # type: ignore[method-assign]
        return spec


#: The name of each `LiveTrainable`'s thread.
_TRAINABLE_THREAD = "stage-batch-"


def _trainables_running() -> bool:
    return any(thread.name.startswith(_TRAINABLE_THREAD) for thread in threading.enumerate())


class LiveTrainable:
    """A trainable training one stage batch after another in its own thread:
    the first batch starts it, each batch that continues a parked one is
    handed to it (`resume`), and `outcome` waits for the current batch's."""

    def __init__(
        self, train: Callable[[StageContext], BatchOutcome], context_for: Callable[..., StageContext], spec: BatchSpec
    ) -> None:
        self._outcomes: queue.SimpleQueue[BatchOutcome] = queue.SimpleQueue()
        self._follow_ups: queue.SimpleQueue[BatchSpec | None] = queue.SimpleQueue()
        self.context = context_for(spec, self._park)
        self._train = train
        self._thread = threading.Thread(target=self._run, name=f"{_TRAINABLE_THREAD}{spec.batch_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        keep = self.context.spec.log_to_file  # RunConfig(log_to_file=...): the trainable's output for its trials
        with trial_output.captured(self.context.output) if keep else contextlib.nullcontext():
            self._outcomes.put(self._train(self.context))

    def _park(self, outcome: BatchOutcome) -> BatchSpec | None:
        self._outcomes.put(outcome)
        return self._follow_ups.get()

    def outcome(self, timeout: float | None = None) -> BatchOutcome | None:
        """The batch's outcome; None if it has none after ``timeout`` seconds."""
        try:
            return self._outcomes.get(timeout=timeout)
        except queue.Empty:
            return None

    def resume(self, spec: BatchSpec) -> None:
        self._follow_ups.put(spec)

    def release(self) -> None:
        """End the parked trainable (its loop gets `BatchEnd`, its cleanup runs)."""
        self._follow_ups.put(None)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


class StageWorker:
    """Ray actor body (run with ``max_concurrency=3``): runs one batch at a
    time, hands out its checkpoints, and releases parked trainables.

    The trainable arrives pickled and is loaded after the Tune shims are in
    place, so names it imported from ``ray.tune`` resolve to ours.
    """

    def __init__(self, trainable_bytes: bytes, controller: Any, peers: Sequence[Any] = (), backend: str = "") -> None:
        _install_tune_shims()
        # Tune's trainables read the driver's directory from here; each batch runs
        # in its trial's working directory (`trial_workdir`) and comes back here.
        os.environ.setdefault(working_dirs.ORIGINAL_DIR_VARIABLE, os.getcwd())
        scratch.reap()  # what killed workers of this host left
        self._process_started = time.time()
        self._outbox: dict[str, CheckpointPayload] = {}
        self._parked: dict[int, LiveTrainable] = {}  # by the batch they parked at the end of
        # Ranks 1..N-1 of this worker's data-parallel group (`group.PeerWorker`), which the controller started.
        self._peers = Peers(list(peers), backend) if peers else None
        # Or those it started for a Train v2 trainer's shape (`_grow`), kept for the next trainer of that shape.
        self._grown: Peers | None = None
        self._peer_runs: dict[Any, int] = {}  # the running batch's peer runs -> their ranks
        self._load(trainable_bytes, controller)

    def _load(self, trainable_bytes: bytes, controller: Any) -> None:
        """Run ``trainable_bytes`` for ``controller`` (the actor its reports go to)."""
        import ray.cloudpickle

        self._controller = controller
        self._trainable_bytes = trainable_bytes  # what the ranks it grows (`_grow`) load
        self._trainable: Any = None
        # Raising here would kill the actor with a C++ stack trace per worker
        # and restart; the controller ends the study with this message instead.
        self._load_error: str | None = None
        try:
            self._trainable = ray.cloudpickle.loads(trainable_bytes)
        except Exception as error:
            self._load_error = _load_error_message(error)
        self._is_class = isinstance(self._trainable, type)

    def serve(self, trainable_bytes: bytes, controller: Any) -> bool:
        """Run the driver's next study, whose worker this process was in its
        last one (`runtime.driver.kept_workers`). False, and nothing changed,
        where it would not run as a new worker: a trainable of the last study
        still runs here (its clean-up outlived `close`), or a module it
        imported from outside the installed packages changed on disk since
        this process started (a notebook's edited module: a new process
        imports it as it is now)."""
        if _trainables_running() or modules_changed_since(self._process_started):
            return False
        self._outbox.clear()
        self._load(trainable_bytes, controller)
        return True

    def pid(self) -> int:
        return os.getpid()

    def take_checkpoint(self, key: str) -> CheckpointPayload:
        return self._outbox.pop(key)

    def release(self, batch_id: int) -> None:
        """The trainable parked at the end of ``batch_id`` is not needed any more."""
        live = self._parked.pop(batch_id, None)
        if live is not None:
            live.release()

    def close(self) -> None:
        """The study is over: end the parked trainables (their cleanup runs,
        for up to `CLOSE_WAIT_S` in all), remove this process's temporary
        folders (`scratch`) and the working files it kept where trials
        forked (`trial_workdir.close`), and let go of its ``with_parameters`` objects;
        the controller kills the worker next, or the driver keeps it for its
        next study (`serve`)."""
        parked, self._parked = list(self._parked.values()), {}
        for live in parked:
            live.release()
        deadline = time.monotonic() + CLOSE_WAIT_S
        for live in parked:
            live.join(max(0.0, deadline - time.monotonic()))
        if self._grown is not None:  # the controller knows only this rank
            self._grown.close(CLOSE_WAIT_S)
            self.shed_group()
        KEPT.release()  # the objects kept for reuse_actors: their cleanup runs
        scratch.remove()
        trial_workdir.close()
        parameters.drop_resident()

    def shed_group(self) -> None:
        """Stop the ranks this worker grew (`_grow`), and free their placement group."""
        grown, self._grown = self._grown, None
        if grown is not None:
            grown.stop()

    def run_batch(self, spec: BatchSpec) -> BatchOutcome:
        if self._load_error is not None:
            return BatchOutcome(spec.batch_id, error=self._load_error, trainable_unloadable=True)
        if spec.resumes is not None:
            live = self._parked.pop(spec.resumes, None)
            if live is None:
                return BatchOutcome(
                    spec.batch_id, source_lost=f"no trainable is parked at the end of batch {spec.resumes}"
                )
            trial_workdir.enter(spec)
            live.resume(spec)
        else:
            live = LiveTrainable(self._train, self._context, spec)
            try:
                live.context.source_payload()
            except (ray.exceptions.ObjectLostError, ray.exceptions.RayActorError) as error:
                # Lost with its node, or never taken: the worker that made it died right after reporting it
                # (its take_checkpoint call never ran). Not this batch's failure: it starts again without it.
                return BatchOutcome(
                    spec.batch_id, source_lost=f"the checkpoint batch {spec.batch_id} starts from is lost: {error}"
                )
            trial_workdir.enter(spec)  # before the other ranks join the folder it may seed
            if self._peers is not None:
                self._peer_runs = self._peers.start(spec)
            live.start()
        outcome = self._await(live, spec.batch_id)
        trial_workdir.leave(spec, live.context.iteration)
        if outcome.parked:
            self._parked[spec.batch_id] = live
        if outcome.returned_at == 0:
            outcome.returned_facts = worker_facts()
        return outcome

    def _context(self, spec: BatchSpec, park: Callable[[BatchOutcome], BatchSpec | None]) -> StageContext:
        if self._peers is None:
            context = StageContext(spec, self._controller, self._outbox.__setitem__, park)
            context.grow_group = functools.partial(self._grow, context)
            return context
        # A group never parks: its ranks would each hold a live trainable for one trial.
        group = RankGroup(self._peers.rank_infos()[0])
        return StageContext(spec, self._controller, self._outbox.__setitem__, group=group)

    def _grow(self, context: StageContext, scaling: Scaling) -> None:
        """Become rank 0 of a group of ``scaling``'s shape for the rest of
        ``context``'s batch, which reported nothing yet (`train_runs`: a
        Train v2 trainer asked for more workers than this stage has): the
        other ranks train the batch from its start, and this one joins them.
        They stay for the next batch whose trainer has that shape; one of
        another shape replaces them."""
        if self._grown is None or self._grown.scaling != scaling:
            self.shed_group()
            peer = remote_once(PeerWorker)
            self._grown = Peers.grow(
                scaling, lambda options: peer.options(max_concurrency=2, **options).remote(self._trainable_bytes)
            )
        self._peer_runs = self._grown.start(context.spec)
        context.join_group(RankGroup(self._grown.rank_infos()[0]))

    def _await(self, live: LiveTrainable, batch_id: int) -> BatchOutcome:
        """The batch's outcome: rank 0's, or the error of a peer that failed
        (a group's, or one the batch grew, `_grow`). A rank that died ends
        this process too, so the controller sees a dead worker (`runtime.workers.group`)."""
        try:
            return self._await_ranks(live, batch_id)
        finally:
            self._peer_runs = {}

    def _await_ranks(self, live: LiveTrainable, batch_id: int) -> BatchOutcome:
        outcome = None
        while outcome is None:
            outcome = live.outcome(timeout=PEER_POLL_S)
            runs = self._peer_runs
            done, _ = ray.wait(list(runs), num_returns=len(runs), timeout=0) if runs else ([], [])
            for ref in done:
                failed = self._peer_failed(ref, runs.pop(ref), batch_id)
                if failed is not None:
                    return failed
            # The other ranks of a group may wait for rank 0 for ever.
            if outcome is not None and outcome.error is not None and live.context.group is not None:
                outcome.worker_broken = True
                return outcome
        for ref, rank in self._peer_runs.items():
            failed = self._peer_failed(ref, rank, batch_id)
            if failed is not None:
                return failed
        return outcome

    def _peer_failed(self, ref: Any, rank: int, batch_id: int) -> BatchOutcome | None:
        """The outcome of rank ``rank``'s batch if it failed; None if it did not."""
        try:
            outcome: BatchOutcome = ray.get(ref)
        except ray.exceptions.RayActorError as error:
            print(f"rank {rank} of the worker group running batch {batch_id} died: {error}", flush=True)
            os._exit(1)  # as any dead worker: the controller retries the batch on a fresh group
        if outcome.error is None:
            return None
        outcome.batch_id = batch_id
        outcome.error = f"rank {rank} of the worker group failed:\n{outcome.error}"
        outcome.worker_broken = True
        return outcome

    def _train(self, context: StageContext) -> BatchOutcome:
        """Run the trainable through ``context``'s batches; the last one's outcome."""
        spec = context.spec
        try:
            if context.group is not None:
                context.group.connect()
            if spec.reproducibility is not None:  # before the trainable builds anything random
                seed_stage(spec.reproducibility, spec.config, spec.start)
            elif spec.source is None:
                # A fresh stream, as a fresh trial's process has under Tune: this worker's current state is
                # the last batch's end, which its checkpoint holds, and that trial would replay these numbers.
                seed_everything(int.from_bytes(os.urandom(8), "big") >> 1)
            if self._is_class:
                run_class(self._trainable, context)
            else:
                run_function(self._trainable, context)
            # Inside the try: a final checkpoint that cannot be packed is the trial's error.
            return context.finish()
        # SystemExit too (a trainable calling sys.exit()): in this thread it would
        # end the thread silently, and the worker would wait for the batch forever.
        except (Exception, SystemExit) as error:
            outcome = context.finish(failed=True)
            outcome.error = traceback.format_exc() + _sequence_hint(error)
            outcome.error_pickle = pack_error(error, outcome.error, f"{_name(self._trainable)}.train()")
            outcome.error_iteration = context.iteration + 1
            outcome.error_node = context.spec.node_at(min(context.iteration + 1, context.spec.stop))
            outcome.error_retryable = not isinstance(error, (ReportError, NestedTrainRunError))
            outcome.error_in_restore = context.restoring
            return outcome


class PeerWorker(StageWorker):
    """Ray actor body of rank k > 0 of a data-parallel group: trains each of
    rank 0's batches as that rank (`runtime.workers.group`)."""

    def __init__(self, trainable_bytes: bytes) -> None:
        super().__init__(trainable_bytes, controller=None)
        self._info: RankInfo | None = None

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def run_rank(self, spec: BatchSpec, info: RankInfo) -> BatchOutcome:
        self._info = info
        if self._load_error is not None:
            return BatchOutcome(spec.batch_id, error=self._load_error, trainable_unloadable=True)
        live = LiveTrainable(self._train, self._context, spec)
        trial_workdir.enter(spec, seed=False)
        live.start()
        outcome = live.outcome()
        assert outcome is not None
        trial_workdir.leave(spec, live.context.iteration, upload=False)
        return outcome

    def _context(self, spec: BatchSpec, park: Callable[[BatchOutcome], BatchSpec | None]) -> StageContext:
        assert self._info is not None
        return PeerContext(spec, RankGroup(self._info))
