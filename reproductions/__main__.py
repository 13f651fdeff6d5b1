"""``python -m reproductions``: see :mod:`reproductions.cli`."""

import sys

from reproductions.cli import main

sys.exit(main())
