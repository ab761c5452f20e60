"""Run every release benchmark's ``--quick`` mode (the test suite runs each as a test: tests/test_release_quick.py).

Each ``release/bench_*.py`` runs in its own process (each starts and stops
its own Ray); the first failure stops the run with its exit code. Quick
figures are too small to mean anything: they only show that every benchmark
still runs end to end. The full figures are in ``release/RESULTS.md``.

    python release/run_quick.py
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import time


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    for path in sorted(glob.glob(os.path.join(here, "bench_*.py"))):
        name = os.path.basename(path)
        print(f"== {name} --quick", flush=True)
        started = time.perf_counter()
        code = subprocess.call([sys.executable, path, "--quick"])
        if code != 0:
            print(f"== {name} --quick failed with exit code {code}", flush=True)
            return code
        print(f"== {name} --quick passed in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
