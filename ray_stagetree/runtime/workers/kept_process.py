"""Whether a process kept for a driver's next study still runs that study's
code as a new process would (`runtime.driver.controllers`,
`runtime.driver.kept_workers`).

A process imports a module once. One the user edited after the process
imported it (a notebook's helper module, a trainable's or a scheduler's)
would run as it was: a new process imports it as it is now. The installed
packages (the standard library, site-packages) are not looked at: they do
not change under a running driver.
"""

from __future__ import annotations

import os
import sys
import sysconfig

_INSTALLED = tuple({sysconfig.get_paths()[name] for name in ("stdlib", "platstdlib", "purelib", "platlib")})


def modules_changed_since(moment: float) -> bool:
    """Whether the file of a module imported here from outside the installed
    packages changed after ``moment`` (``time.time()`` when the process started)."""
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path or path.startswith(_INSTALLED):
            continue
        try:
            if os.stat(path).st_mtime > moment:
                return True
        except OSError:
            continue
    return False
