"""What every release benchmark shares: its command line, interleaved repeats,
medians with ranges, and the one markdown section it prints.

The convention (`release/run_all.py` relies on it): a benchmark takes
``--quick`` (CI's smoke test) or ``--full``, ``--repeats`` and ``--out``;
its standard output is exactly one markdown section, starting with ``## ``
(``(model)`` in the title for simulated figures), whose first line states the
commit, date, machine, load and repeats; everything else (its own progress,
Ray's and Tune's output) goes to standard error. Files it writes go to a
temporary folder outside the checkout unless ``--out`` names one.

Systems compared side by side run interleaved in one process (A, B, A, B,
...), so that a change in the machine's load over the run falls on all of
them alike, and each figure is quoted as its median and range over the
repeats; a ratio is the median (and range) of the per-repeat ratios of runs
made next to each other.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from ray import tune

RELEASE = os.path.dirname(os.path.abspath(__file__))
#: Exit code of a benchmark that cannot measure on this machine (no GPU): run_all keeps its last section.
CANNOT_MEASURE_HERE = 3


#: When --time-budget runs out (``time.monotonic()``), and the parsed arguments whose ``repeats`` says how many ran.
_DEADLINE: float | None = None
_PARSED: argparse.Namespace | None = None


def parser(description: str | None, quick_repeats: int = 1, full_repeats: int = 3) -> argparse.ArgumentParser:
    """The benchmark's argument parser with the shared options; ``parse``
    fills in ``--repeats`` from the mode."""
    result = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = result.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="CI's smoke test: small, its figures mean nothing")
    mode.add_argument("--full", action="store_true", help="the figures RESULTS.md quotes (the default)")
    result.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"runs per system, interleaved (default {full_repeats}; {quick_repeats} with --quick)",
    )
    result.add_argument("--out", default=None, help="folder for the files it writes (default: a temporary folder)")
    result.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="S",
        help="start no repeat that would end past S seconds from the start, judged by the last one (a device "
        "call's limit); the section reports the repeats done",
    )
    result.set_defaults(_repeats=(quick_repeats, full_repeats))
    return result


def parse(arguments: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse, check ``--repeats`` and ``--time-budget``, and send everything but the section to standard error."""
    global _DEADLINE, _PARSED
    args = arguments.parse_args(argv)
    quick_repeats, full_repeats = args._repeats
    if args.repeats is None:
        args.repeats = quick_repeats if args.quick else full_repeats
    if args.repeats < 1:
        arguments.error(f"--repeats must be at least 1, got {args.repeats}")
    args.full = not args.quick
    if args.time_budget is not None:
        if not args.time_budget > 0:
            arguments.error(f"--time-budget must be > 0 seconds, got {args.time_budget}")
        _DEADLINE = time.monotonic() + args.time_budget
    _PARSED = args
    _stdout_to_stderr()
    return args


_SECTION_OUT: TextIO | None = None


def _stdout_to_stderr() -> None:
    """Keep the real standard output for the section; point file descriptor 1
    (and so Ray's, Tune's and every child process's output) at standard error."""
    global _SECTION_OUT
    if _SECTION_OUT is not None:
        return
    sys.stdout.flush()
    _SECTION_OUT = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def start_ray(**options: Any) -> None:
    """A Ray of the benchmark's own on this machine, never a cluster found
    running here (``ray_stagetree.init_ray`` and ``ray.init()`` would join the
    latest ``ray start``, whose load is not the benchmark's)."""
    import ray

    defaults = {"include_dashboard": False, "configure_logging": False, "log_to_driver": False}
    ray.init(address="local", **{**defaults, **options})


def log(*parts: Any) -> None:
    """Progress, to standard error."""
    print(*parts, file=sys.stderr, flush=True)


def out_dir(args: argparse.Namespace, prefix: str) -> str:
    """``--out``, created, or a new temporary folder outside the checkout."""
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        return args.out
    return tempfile.mkdtemp(prefix=f"{prefix}_")


def commit() -> str:
    """The checkout's commit, ``+changes`` when its tracked files other
    than RESULTS.md (what the benchmarks write, not what they run) differ from it;
    ``STAGETREE_RELEASE_COMMIT`` where the scripts run from a copy outside it
    (`gpu_session.sh`)."""
    if os.environ.get("STAGETREE_RELEASE_COMMIT"):
        return os.environ["STAGETREE_RELEASE_COMMIT"]
    try:
        head = subprocess.run(
            ["git", "-C", RELEASE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            [
                "git",
                "-C",
                RELEASE,
                "status",
                "--porcelain",
                "--untracked-files=no",
                ":/",
                ":(top,exclude)release/RESULTS.md",
            ],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}+changes" if changed else head


def machine() -> str:
    """Cores, memory, accelerator-free software versions: what a reader needs to compare."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = [f"Python {platform.python_version()}"]
    for module in ("ray", "torch"):
        loaded = sys.modules.get(module)
        if loaded is not None:
            versions.append(f"{module} {loaded.__version__}")
    return f"{platform.machine()}, {os.cpu_count()} CPUs, {memory:.0f} GiB; {', '.join(versions)}"


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


@dataclass
class Section:
    """The markdown section a benchmark prints: title, the line saying where
    and when it was measured, then paragraphs and tables in order."""

    title: str
    args: argparse.Namespace
    model: bool = False
    parts: list[str] = field(default_factory=list)
    started_load: str = field(default_factory=load)
    started: float = field(default_factory=time.time)

    def text(self, *lines: str) -> None:
        self.parts.append("\n".join(lines))

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[Any]], right: Sequence[bool] | None = None) -> None:
        right = right or [index > 0 for index in range(len(headers))]
        lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---:" if r else "---" for r in right) + " |"]
        lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
        self.parts.append("\n".join(lines))

    @contextlib.contextmanager
    def verbatim(self) -> Iterator[None]:
        """What the block prints, as a preformatted block of the section (for
        a benchmark whose tables are aligned text)."""
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            yield
        self.parts.append("```\n" + buffer.getvalue().strip("\n") + "\n```")

    def render(self) -> str:
        title = f"{self.title} (model)" if self.model and "(model)" not in self.title else self.title
        date = datetime.datetime.fromtimestamp(self.started, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        minutes = (time.time() - self.started) / 60
        command = " ".join(["python", os.path.relpath(os.path.abspath(sys.argv[0]), os.path.dirname(RELEASE))])
        command += " " + " ".join(sys.argv[1:])
        meta = (
            f"_Commit `{commit()}`, {date}, `{command.strip()}`, {self.args.repeats} repeat(s); machine: {machine()};"
            f" load (1/5/15 min) {self.started_load} at the start, {load()} at the end; {minutes:.1f} min._"
        )
        return "\n\n".join([f"## {title}", meta, *self.parts]) + "\n"

    def emit(self) -> None:
        """Print the section: the benchmark's only standard output."""
        stream = _SECTION_OUT or sys.stdout
        stream.write(self.render())
        stream.flush()


def interleaved(
    systems: Mapping[str, Callable[[], Mapping[str, Any]]], repeats: int, label: str = ""
) -> dict[str, list[Mapping[str, Any]]]:
    """Run every system ``repeats`` times, interleaved (A, B, A, B, ...);
    each run's figures, by system, in the order run. Each run's figures get
    the 1-minute load average at its start (``load``)."""
    runs: dict[str, list[Mapping[str, Any]]] = {name: [] for name in systems}
    last = 0.0  # seconds the last repeat took
    for repeat in range(repeats):
        started = time.monotonic()
        if repeat and _DEADLINE is not None and started + last > _DEADLINE:
            log(f"{label}: --time-budget leaves too little for repeat {repeat + 1} (the last took {last:.0f} s)")
            if _PARSED is not None:
                _PARSED.repeats = repeat
            break
        for name, run in systems.items():
            before = os.getloadavg()[0]
            figures = dict(run())
            figures.setdefault("load", before)
            runs[name].append(figures)
            shown = ", ".join(f"{key} {_short(value)}" for key, value in figures.items() if _is_figure(value))
            log(f"{label} repeat {repeat + 1}/{repeats} {name}: {shown}")
        last = time.monotonic() - started
    return runs


def _is_figure(value: Any) -> bool:
    return isinstance(value, (int, float, str, bool))


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def values(runs: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [float(run[key]) for run in runs]


def median_range(numbers: Sequence[float], digits: int = 1, suffix: str = "", missing: str = "not reached") -> str:
    """``median [low-high]``, or the one value; NaN counts as ``missing``."""
    finite = [number for number in numbers if not math.isnan(number)]
    if not finite:
        return missing
    absent = len(numbers) - len(finite)
    median = statistics.median(finite)
    text = f"{median:.{digits}f}{suffix}"
    if len(finite) > 1:
        text += f" [{min(finite):.{digits}f}-{max(finite):.{digits}f}]"
    if absent:
        text += f" ({absent} {missing})"
    return text


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Per-repeat ratios of runs made next to each other."""
    return [a / b if b else math.nan for a, b in zip(numerators, denominators, strict=True)]


def ratio(numerators: Sequence[float], denominators: Sequence[float]) -> str:
    """The median [range] of the per-repeat ratios, as ``1.23x [1.1-1.4]``."""
    return median_range(ratios(numerators, denominators), digits=2, suffix="x")


def median(numbers: Sequence[float]) -> float:
    finite = [number for number in numbers if not math.isnan(number)]
    return statistics.median(finite) if finite else math.nan


def fastest(runs: Mapping[str, Sequence[Mapping[str, Any]]], names: Iterable[str], key: str) -> str:
    """Of ``names`` that ran (a quick run leaves some out), the system with
    the smallest median ``key``: the baseline at its best, which a headline
    ratio is taken against."""
    names = list(names)
    ran = [name for name in names if name in runs]
    if not ran:
        raise ValueError(f"none of {names} ran: no baseline to compare with")
    return min(ran, key=lambda name: median(values(runs[name], key)))


def loads(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """The range of the 1-minute load at the start of the runs."""
    every = [run["load"] for system in runs.values() for run in system]
    return f"{min(every):.1f}-{max(every):.1f}"


class TrialOccupancy(tune.Callback):
    """Seconds each Tune trial held its worker: start to completion; and
    when the first trial started and the last ended (``time.monotonic()``)."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.seconds = 0.0
        self.first_start = math.inf
        self.last_end = -math.inf

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        now = time.monotonic()
        self.started[trial.trial_id] = now
        self.first_start = min(self.first_start, now)

    def _ended(self, trial) -> None:
        started = self.started.pop(trial.trial_id, None)
        if started is not None:
            now = time.monotonic()
            self.seconds += now - started
            self.last_end = max(self.last_end, now)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._ended(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._ended(trial)
