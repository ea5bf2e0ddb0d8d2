"""Why a COPY into activity was refused is read from the error's fields, never its text.

PostgreSQL translates messages under ``lc_messages``: a German server says "keine Partition
von Relation »activity« für die Zeile gefunden" (seen on PostgreSQL 15 here, with a locale
built by localedef). The writer once matched the English words "no partition", so under a
translated lc_messages it exited instead of making the day's partition.
"""

from __future__ import annotations

import asyncpg
import pytest

from ackline.sinks.ingest.writer import copy_refusal


def _error(fields: dict[str, str]) -> asyncpg.PostgresError:
    return asyncpg.exceptions.PostgresError.new({"S": "ERROR", **fields})


GERMAN_NO_PARTITION = "keine Partition von Relation »activity« für die Zeile gefunden"


@pytest.mark.parametrize(
    "message",
    [GERMAN_NO_PARTITION, 'no partition of relation "activity" found for row', "?"],
)
def test_a_row_routed_to_no_partition_is_known_by_its_fields_in_any_language(
    message: str,
) -> None:
    exc = _error({"C": "23514", "M": message, "s": "public", "t": "activity"})
    assert isinstance(exc, asyncpg.CheckViolationError)
    assert copy_refusal(exc) == "no_partition"


def test_a_check_constraints_violation_is_not_a_missing_partition() -> None:
    # a CHECK constraint names itself; routing to no partition names none
    exc = _error({"C": "23514", "M": "no partition", "t": "activity", "n": "activity_ok"})
    assert copy_refusal(exc) is None


def test_another_tables_refusal_is_not_activitys() -> None:
    exc = _error({"C": "23514", "M": GERMAN_NO_PARTITION, "t": "event_keys"})
    assert copy_refusal(exc) is None


def test_a_null_ingested_on_is_known_by_its_column_in_any_language() -> None:
    exc = _error({"C": "23502", "M": "NULL-Wert in Spalte »ingested_on«", "c": "ingested_on"})
    assert isinstance(exc, asyncpg.NotNullViolationError)
    assert copy_refusal(exc) == "no_ingested_on"
    other = _error({"C": "23502", "M": "ingested_on", "c": "event_id"})
    assert copy_refusal(other) is None


def test_other_errors_are_not_refusals_of_the_schema() -> None:
    assert copy_refusal(_error({"C": "23505", "M": "no partition", "t": "activity"})) is None
    assert copy_refusal(ValueError("no partition")) is None
