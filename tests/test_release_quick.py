"""Every release benchmark still runs end to end (its ``--quick`` mode) and
prints what `release/run_all.py` puts in RESULTS.md: one markdown section
whose first line says where, when and how it was measured.

Each runs in its own process, as `release/run_all.py --quick` runs them, so
that it starts and stops its own Ray; here they are tests, so that the test
runner's workers run them beside the rest of the suite. Quick figures mean
nothing: the full ones are in ``release/RESULTS.md``.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

RELEASE = Path(__file__).resolve().parent.parent / "release"
sys.path.insert(0, str(RELEASE))

import run_all  # noqa: E402
from harness import CANNOT_MEASURE_HERE  # noqa: E402

BENCHMARKS = sorted(path.name for path in RELEASE.glob("bench_*.py"))
# Quick runs over a minute of CPU on 2 cores, beside the suite: run with
# STAGETREE_ALL_BENCHMARKS=1 (or `python release/run_all.py --quick`) before a release.
# (bench_pbt.py runs Ray's pbt_example under both Tuners, as
# tests/drop_in/test_tune_style_scripts.py::test_rays_own_pbt_example_reaches_its_target does;
# bench_scale.py's quick run took two minutes of CI's 25; bench_time_sharing_runtime.py's, over one;
# bench_asha.py's and bench_restore.py's, 30 s each of the suite's two test processes' 23 minutes.)
HEAVY = {
    "bench_asha.py",
    "bench_restore.py",
    "bench_reuse.py",
    "bench_time_sharing_runtime.py",
    "bench_tune.py",
    "bench_overhead.py",
    "bench_multistudy.py",
    "bench_frameworks.py",
    "bench_pbt.py",
    "bench_scale.py",
}
# Quick runs of close to a minute beside the suite: started first (tests/conftest.py).
LONG = {"bench_checkpoint.py"}


def test_every_benchmark_is_here_and_in_run_all():
    assert len(BENCHMARKS) >= 10, BENCHMARKS
    assert sorted(run_all.SCRIPTS) == BENCHMARKS


@pytest.mark.parametrize(
    "script", [pytest.param(script, marks=pytest.mark.long) if script in LONG else script for script in BENCHMARKS]
)
def test_benchmark_runs_in_quick_mode(script, tmp_path):
    if script in HEAVY and os.environ.get("STAGETREE_ALL_BENCHMARKS") != "1":
        pytest.skip(f"{script} --quick runs with STAGETREE_ALL_BENCHMARKS=1 (CI's time)")
    # The benchmark's own Ray, not the test session's: no address, token or other Ray setting inherited.
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    done = subprocess.run(
        [sys.executable, str(RELEASE / script), "--quick"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    # Without a GPU, bench_gpu.py says so in its section and exits CANNOT_MEASURE_HERE.
    assert done.returncode in (0, CANNOT_MEASURE_HERE), (
        f"{script} --quick exited with {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    run_all.check_section(script, done.stdout)  # raises, naming what is wrong


def test_the_gpu_session_runs_its_benchmarks_from_a_copy_that_holds_what_they_import(tmp_path):
    """`gpu_session.sh` runs the benchmarks from a scratch copy (away from the
    repo's package folder, which would shadow the installed one on Ray's
    workers); the copy must hold what they import: bench_gpu.py reaches
    examples/ through bench_tune.py. Checked first on every call, before any
    device time goes on a part; a dry run uses the packages installed here."""
    env = {
        **os.environ,
        "GPU_SESSION_DRY_RUN": "1",
        "OUT": str(tmp_path),
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),  # its python3
    }
    done = subprocess.run(
        ["bash", str(RELEASE / "gpu_session.sh"), "imports"], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "== imports: bench_gpu.py and bench_overhead.py import from the scratch copy" in done.stdout
