"""The benchmark: ackline beside the raw COPY limit and three peers (``make bench``).

* :mod:`load.bench.run` runs every phase and writes ``results.json`` and ``results.png``;
* :mod:`load.bench.backlog` drains a 10 M backlog while sampling RSS (``make bench-backlog``);
* :mod:`load.bench.data` makes and keeps the events; :mod:`load.bench.limit` is the limit;
* :mod:`load.bench.systems` starts each system; :mod:`load.bench.peers` installs the peers;
* :mod:`load.bench.measure` measures processes; :mod:`load.bench.report` renders results.
"""
