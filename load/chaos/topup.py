"""The chaos producer's top-up: production goes on past its plan while the harness holds it.

Faults are planned by ingest progress and take their time (a COMMIT fault waits for a
restarted worker to stall), so a run's faults can lag its ingest. Once production had
ended and the backlog was drained, a late COMMIT fault found nothing to commit and the run
failed its coverage though exactly once held (a faust run, seed 1199904273: "2 of 3").
The harness now holds production open until its faults and their top-ups are done; past
the plan the producer sends further plans, paced by :mod:`ackline.load.chaos.pacing`.
They go into the same manifest, so verify expects them like the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator

from ackline.load.generate import Knobs, Send, generate

TOP_UP_EVENTS = 500
"""Originals in each further plan: about one transaction, so production ends within one
of them after the harness lets go."""


def held_open(
    plan: Iterable[Send], held: Callable[[], bool], knobs: Knobs, seed: int, namespace: str
) -> Iterator[Send]:
    """``plan``, then, while ``held()``, further plans of :data:`TOP_UP_EVENTS` originals.

    Each further plan has a namespace of its own (no id of the run repeats) and is
    numbered on (``seq``, ``original_index``, ``transaction``): the manifest stays one
    sequence of transactions, each whole and committed after any aborted attempt of it.
    """
    seq = transaction = 0
    sends = plan
    topped = 0
    while True:
        base_seq, base_transaction = seq, transaction
        for send in sends:
            moved = dataclasses.replace(
                send,
                seq=send.seq + base_seq,
                transaction=send.transaction + base_transaction,
                original_index=None
                if send.original_index is None
                else send.original_index + base_seq,
            )
            seq = max(seq, moved.seq + 1)
            transaction = max(transaction, moved.transaction + 1)
            yield moved
        if not held():
            return
        topped += 1
        sends = generate(TOP_UP_EVENTS, knobs, seed, namespace=f"{namespace}/top-up-{topped}")
