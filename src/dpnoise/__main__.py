"""``python -m dpnoise`` is the ``dpnoise`` command line."""

from dpnoise.cli.main import main

raise SystemExit(main())
