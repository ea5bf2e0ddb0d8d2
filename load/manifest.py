"""The ground truth of a load run: one JSON line per record sent (gzip when ``.gz``).

Layout::

    {"manifest": "ackline-load", "version": 1, "run_id": ..., "topic": ..., "seed": ...,
     "namespace": ..., "partitions": ..., "events": ..., "txn_size": ...,
     "knobs": {...}, "created_at": "...Z"}                               <- header
    {"seq": 0, "kind": "original", "partition": 3, "offset": 17, "committed": true,
     "transaction": 0, "event_id": "...", "txn_id": "...", "body_hash": "<hex>",
     "poison": null, "original": null, "size": 512}                     <- one per send
    ...
    {"end": true, "records": 123456}                                     <- trailer

``committed`` is false for records sent in an aborted transaction; their ``offset`` is
the one the broker gave them (aborted records occupy offsets), or -1 when the delivery
report carried an error. The file is written to ``<path>.partial`` and renamed when the
trailer is written, so a manifest at ``path`` is always complete.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final, Literal

from ackline.load.errors import LoadError
from ackline.load.generate import Send

FORMAT: Final = "ackline-load"
VERSION: Final = 1


@dataclass(frozen=True)
class ManifestHeader:
    run_id: str
    topic: str
    seed: int
    partitions: int
    events: int
    txn_size: int
    knobs: dict[str, Any]
    created_at: str
    namespace: str = ""
    transactional_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"manifest": FORMAT, "version": VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ManifestHeader:
        if data.get("manifest") != FORMAT:
            raise LoadError("not an ackline load manifest (bad header line)")
        if data.get("version") != VERSION:
            raise LoadError(f"unsupported manifest version {data.get('version')!r}")
        try:
            return cls(
                run_id=str(data["run_id"]),
                topic=str(data["topic"]),
                seed=int(data["seed"]),
                partitions=int(data["partitions"]),
                events=int(data["events"]),
                txn_size=int(data["txn_size"]),
                knobs=dict(data["knobs"]),
                created_at=str(data["created_at"]),
                namespace=str(data.get("namespace", "")),
                transactional_id=str(data.get("transactional_id", "")),
                extra=dict(data.get("extra", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LoadError(f"bad manifest header: {exc}") from exc


@dataclass(frozen=True, slots=True)
class ManifestRecord:
    """One record sent: what it was and where the broker put it."""

    seq: int
    kind: str
    partition: int
    offset: int
    committed: bool
    event_id: str | None = None
    txn_id: str | None = None
    body_hash: str | None = None
    """Hex SHA-256 of the canonical body; None for poison."""
    poison: str | None = None
    """The decode reason a poison record must be rejected with."""
    original: int | None = None
    """For a variant: the seq of its original."""
    transaction: int = 0
    size: int = 0

    @classmethod
    def from_send(cls, send: Send, partition: int, offset: int) -> ManifestRecord:
        """The line for ``send`` delivered at (partition, offset); -1 when it failed."""
        return cls(
            seq=send.seq,
            kind=send.kind,
            partition=partition,
            offset=offset,
            committed=not send.aborted,
            event_id=send.event_id,
            txn_id=send.txn_id,
            body_hash=send.body_hash_hex,
            poison=send.poison_reason,
            original=send.original_index,
            transaction=send.transaction,
            size=len(send.value),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "kind": self.kind,
            "partition": self.partition,
            "offset": self.offset,
            "committed": self.committed,
            "transaction": self.transaction,
            "event_id": self.event_id,
            "txn_id": self.txn_id,
            "body_hash": self.body_hash,
            "poison": self.poison,
            "original": self.original,
            "size": self.size,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ManifestRecord:
        try:
            return cls(
                seq=int(data["seq"]),
                kind=str(data["kind"]),
                partition=int(data["partition"]),
                offset=int(data["offset"]),
                committed=bool(data["committed"]),
                event_id=_opt_str(data.get("event_id")),
                txn_id=_opt_str(data.get("txn_id")),
                body_hash=_opt_str(data.get("body_hash")),
                poison=_opt_str(data.get("poison")),
                original=None if data.get("original") is None else int(data["original"]),
                transaction=int(data.get("transaction", 0)),
                size=int(data.get("size", 0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LoadError(f"bad manifest record: {exc}") from exc


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class Manifest:
    header: ManifestHeader
    records: list[ManifestRecord]


def _open(path: Path, mode: Literal["r", "w"], *, like: Path | None = None) -> IO[str]:
    """Open text, gzip-compressed when ``like`` (default ``path``) ends with ``.gz``."""
    if not (like or path).name.endswith(".gz"):
        return path.open(mode, encoding="utf-8")
    if mode == "w":
        return gzip.open(path, "wt", encoding="utf-8", compresslevel=3)
    return gzip.open(path, "rt", encoding="utf-8")


class ManifestWriter:
    """Writes a manifest to ``<path>.partial``; :meth:`close` adds the trailer and renames.

    Used as a context manager, an exception leaves the ``.partial`` file (for diagnosis)
    and no manifest at ``path``.
    """

    def __init__(self, path: Path, header: ManifestHeader) -> None:
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = _open(self.partial, "w", like=self.path)
        self._count = 0
        self._line(header.to_dict())

    def _line(self, data: dict[str, Any]) -> None:
        if self._file is None:
            raise LoadError(f"manifest {self.path} is closed")
        self._file.write(json.dumps(data, separators=(",", ":")) + "\n")

    def write(self, record: ManifestRecord) -> None:
        self._line(record.to_dict())
        self._count += 1

    @property
    def count(self) -> int:
        return self._count

    def close(self) -> None:
        """Write the trailer, close, and move the file into place."""
        if self._file is None:
            return
        self._line({"end": True, "records": self._count})
        self._file.close()
        self._file = None
        os.replace(self.partial, self.path)

    def discard(self) -> None:
        """Close without the trailer; the ``.partial`` file stays."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> ManifestWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()


def iter_manifest(path: Path) -> tuple[ManifestHeader, Iterator[ManifestRecord]]:
    """The header, and an iterator over the records that checks the trailer at the end.

    A file that cannot be read as a manifest (a directory, not gzip when named ``.gz``,
    cut short, not UTF-8) raises LoadError naming it, when opened or while iterated.
    """
    path = Path(path)
    if not path.exists():
        partial = path.with_name(path.name + ".partial")
        hint = ""
        if partial.exists():
            hint = f" (an incomplete {partial.name} exists: produce did not finish)"
        raise LoadError(f"manifest {path} not found{hint}")
    if path.is_dir():
        raise LoadError(f"manifest {path} is a directory: give the manifest file")
    try:
        handle = _open(path, "r")
    except OSError as exc:
        raise _unreadable(path, exc) from exc
    try:
        header = _header(handle, path)
    except BaseException:
        handle.close()
        raise

    def records() -> Iterator[ManifestRecord]:
        with handle:
            count = 0
            while line := _readline(handle, path):
                data = _parse(line, path, count + 2)
                if data.get("end") is True:
                    if data.get("records") != count:
                        raise LoadError(
                            f"manifest {path}: trailer says {data.get('records')} records, "
                            f"found {count}"
                        )
                    return
                try:
                    record = ManifestRecord.from_dict(data)
                except LoadError as exc:
                    raise LoadError(f"manifest {path} line {count + 2}: {exc}") from exc
                yield record
                count += 1
            raise LoadError(f"manifest {path} is truncated (no trailer line)")

    return header, records()


def _header(handle: IO[str], path: Path) -> ManifestHeader:
    first = _readline(handle, path)
    if not first:
        raise LoadError(f"manifest {path} is empty")
    try:
        return ManifestHeader.from_dict(_parse(first, path, 1))
    except LoadError as exc:
        if str(path) in str(exc):
            raise
        raise LoadError(f"manifest {path}: {exc}") from exc


def _readline(handle: IO[str], path: Path) -> str:
    try:
        return handle.readline()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise _unreadable(path, exc) from exc


def _unreadable(path: Path, exc: BaseException) -> LoadError:
    if isinstance(exc, EOFError):
        why = "it is cut short (compressed data ends early)"
    elif isinstance(exc, gzip.BadGzipFile):
        why = "it is not gzip data, though its name ends with .gz"
    elif isinstance(exc, UnicodeDecodeError):
        why = "it is not UTF-8 text"
    elif isinstance(exc, OSError) and exc.errno is not None:
        why = os.strerror(exc.errno).lower()
    else:
        why = str(exc)
    return LoadError(f"cannot read manifest {path}: {why} (give the file produce wrote)")


def _parse(line: str, path: Path, number: int) -> dict[str, Any]:
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise LoadError(f"manifest {path} line {number}: not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise LoadError(f"manifest {path} line {number}: not a JSON object")
    return data


def read_manifest(path: Path) -> Manifest:
    """The whole manifest in memory (LoadError if missing, truncated or malformed)."""
    header, records = iter_manifest(path)
    return Manifest(header, list(records))
