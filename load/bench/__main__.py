"""``python -m load.bench``: see :mod:`load.bench.run`."""

from load.bench.run import main

raise SystemExit(main())
