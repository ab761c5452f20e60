"""Executing a notebook as Jupyter does, for the tests that check what a
notebook user sees: nbconvert runs it in a fresh IPython kernel, whose
stderr (what the terminal running Jupyter shows, the kernel's shutdown
included) comes back with the executed cells."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parent.parent

#: A Ray log line below WARNING ("2026-01-01 10:00:00,000\tINFO worker.py:2038 -- Started a local Ray instance.")
RAY_INFO = re.compile(r"^\S+ \S+\t(DEBUG|INFO) \S+:\d+ -- ", re.MULTILINE)
#: What Ray's crash handler prints when the kernel gets a signal (the stack trace at shutdown).
CRASH_HANDLER = re.compile(r"\*\*\* SIG\w+ received|logging\.cc:\d+")
#: tqdm's and Ray's complaints that ipywidgets is missing.
WIDGET_HINTS = re.compile(r"IProgress not found|Missing packages")


#: Ray's error when a node it starts has not registered within its (fixed) 30 s.
RAY_START_TIMEOUT = "The current node timed out during startup"


def execute(notebook: Path, env: dict[str, str], timeout: int = 600) -> tuple[list[dict[str, Any]], str]:
    """Run ``notebook`` in place; return its cells and the kernel's stderr.

    A cell that raises fails the run, with the kernel's stderr in the message.
    A kernel whose own Ray did not start within Ray's fixed 30 s (a loaded
    machine; not what a notebook test checks) runs up to twice more."""
    for _ in range(3):
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "nbconvert",
                "--to",
                "notebook",
                "--execute",
                "--inplace",
                f"--ExecutePreprocessor.timeout={timeout}",
                str(notebook),
            ],
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")])),
                **env,
            },
            capture_output=True,
            text=True,
        )
        if run.returncode == 0 or RAY_START_TIMEOUT not in run.stderr:
            break
    assert run.returncode == 0, run.stderr[-5000:]
    with open(notebook) as file:
        return json.load(file)["cells"], run.stderr


def stream(cell: dict[str, Any], name: str) -> str:
    """What the cell printed to ``name`` ("stdout" or "stderr")."""
    return "".join(
        "".join(output["text"])
        for output in cell.get("outputs", ())
        if output["output_type"] == "stream" and output["name"] == name
    )


def displays(cell: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        output for output in cell.get("outputs", ()) if output["output_type"] in ("display_data", "update_display_data")
    ]


def noise(cells: list[dict[str, Any]], kernel_stderr: str) -> list[str]:
    """What a quiet notebook must not show: Ray's INFO lines and the widget
    hints in the cells, the crash handler's stack trace in the kernel's stderr."""
    found = [match.group(0) for cell in cells for match in RAY_INFO.finditer(stream(cell, "stderr"))]
    found += [match.group(0) for cell in cells for match in WIDGET_HINTS.finditer(stream(cell, "stderr"))]
    found += [match.group(0) for match in CRASH_HANDLER.finditer(kernel_stderr)]
    return found
