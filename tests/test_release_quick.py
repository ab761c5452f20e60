"""Every release benchmark still runs end to end (its ``--quick`` mode).

Each runs in its own process, as `release/run_quick.py` runs them, so that
it starts and stops its own Ray; here they are tests, so that the test
runner's workers run them beside the rest of the suite. Quick figures mean
nothing: the full ones are in ``release/RESULTS.md``.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

RELEASE = Path(__file__).resolve().parent.parent / "release"
BENCHMARKS = sorted(path.name for path in RELEASE.glob("bench_*.py"))
# Quick runs over a minute of CPU on 2 cores, beside the suite: run with
# STAGETREE_ALL_BENCHMARKS=1 (or `python release/run_quick.py`) before a release.
HEAVY = {"bench_tune.py", "bench_overhead.py", "bench_multistudy.py"}


def test_every_benchmark_is_here():
    assert len(BENCHMARKS) >= 10, BENCHMARKS


@pytest.mark.parametrize("script", BENCHMARKS)
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
    assert done.returncode == 0, (
        f"{script} --quick exited with {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
