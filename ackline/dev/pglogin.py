"""Where a PostgreSQL client's login ends in the bytes it sends: for a relay that carries
the login and nothing after it (:meth:`ackline.dev.netns.Forwarder.mute`).

A client first sends an SSLRequest or GSSENCRequest (8 bytes each, answered with one
byte) if it wants encryption, then its startup message; each is an int32 length that
counts itself, then the rest. With trust authentication that is the whole login: the
server answers with AuthenticationOk, its parameters and ReadyForQuery. Anything the
client sends after it (a password, a statement) is what a muted relay drops: a
connection pooler that logs the client in itself while its server is gone, or a link
that goes dark right after the handshake, looks like that to the client.
"""

from __future__ import annotations

import struct

_ENCRYPTION_REQUESTS = frozenset({80877103, 80877104})  # SSLRequest, GSSENCRequest


class LoginBytes:
    """Follows one connection's client-to-server bytes from its first; :meth:`take` says
    how much of each chunk is still the login."""

    def __init__(self) -> None:
        self._head = b""  # the current message's first 8 bytes, as far as they came
        self._left: int | None = None  # bytes of the current message still to come
        self.done = False

    def take(self, chunk: bytes) -> int:
        """How many leading bytes of ``chunk`` belong to the login (all of them until it
        is done, then none)."""
        used = 0
        while not self.done and used < len(chunk):
            if self._left is None:  # reading a message's length and code
                part = chunk[used : used + 8 - len(self._head)]
                self._head += part
                used += len(part)
                if len(self._head) < 8:
                    continue
                length, code = struct.unpack("!ii", self._head)
                self._left = max(0, length - 8)  # not PostgreSQL's (a Kafka relay): ends here
                if length == 8 and code in _ENCRYPTION_REQUESTS:
                    self._head, self._left = b"", None  # the startup message follows
                    continue
            step = min(self._left, len(chunk) - used)
            used += step
            self._left -= step
            if self._left <= 0:
                self.done = True
        return used
