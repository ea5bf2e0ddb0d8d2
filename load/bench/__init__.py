"""The benchmark: ackline beside the raw COPY limit and three peers (``make bench``).

* :mod:`.run` runs every phase and writes ``results.json`` and ``results.png``;
* :mod:`.backlog` drains a 10 M backlog while sampling RSS (``make bench-backlog``);
* :mod:`.data` makes and keeps the events; :mod:`.limit` is the limit;
* :mod:`.systems` starts each system; :mod:`.peers` installs the peers;
* :mod:`.measure` measures processes; :mod:`.report` renders results.
"""
