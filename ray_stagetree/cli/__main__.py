"""``python -m ray_stagetree.cli``: the ``stagetree`` command."""

import sys

from ray_stagetree.cli import main

sys.exit(main())
