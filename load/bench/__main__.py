"""``python -m ackline.load.bench``: see :mod:`ackline.load.bench.run`."""

from ackline.load.bench.run import main

raise SystemExit(main())
