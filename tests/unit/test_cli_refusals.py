"""Arguments an operator probe found accepted, or refused badly: each is refused at once,
in one line naming the argument and the fix, before any service is contacted."""

from __future__ import annotations

import errno
import getpass
import io
import os
import sys
import warnings
from pathlib import Path
from typing import NoReturn

import pytest

from ackline import cli
from ackline.commands.guard import path_problem
from ackline.load import produce
from ackline.load.paths import TargetError, check_target


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["process", "runs", "--batch-events", "0"], "ackline process"),
        (["processors"], "ackline processors"),
        (["nosuch"], "ackline"),
        # a subcommand hands an option it does not know up to the root: still its own
        (["processors", "reset", "runs", "--nope"], "ackline processors reset"),
    ],
)
def test_a_bad_argument_is_one_line_naming_the_commands_help(
    argv: list[str], prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An operator found `--batch-events 0` refused under nine lines of `process`'s usage."""
    with pytest.raises(SystemExit) as stop:
        cli.parser().parse_args(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert err.startswith(f"{prog}: error: ") and f"(`{prog} --help` says more)" in err, err


@pytest.mark.parametrize(("value", "says"), [("0", ">= 1"), ("99", "at most 52"), ("x", "whole")])
def test_partitions_ensure_keeps_the_settings_range(
    value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--ahead` stands for ACKLINE_PARTITIONS_AHEAD (1 to 52) but took 0 and 99 (99 made
    99 daily partitions; an operator's report)."""
    with pytest.raises(SystemExit) as stop:
        cli.parser().parse_args(["partitions", "ensure", f"--ahead={value}"])
    assert stop.value.code == 2
    assert says in capsys.readouterr().err
    assert cli.parser().parse_args(["partitions", "ensure", "--ahead", "52"]).ahead == 52


@pytest.mark.parametrize("option", ["--timeout", "--idle-timeout"])
@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf", "-inf", "1e12"])
def test_capture_refuses_a_timeout_out_of_range(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A negative --timeout reached librdkafka as 'wait forever' (the capture hung, deaf
    to SIGTERM); nan, inf and 1e12 were taken and failed later ('no answer within inf s')."""
    with pytest.raises(SystemExit) as stop:
        cli.parser().parse_args(["capture", "t", "out.ackcap", f"{option}={value}"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: must be a finite number of seconds above 0" in err


@pytest.mark.parametrize("option", ["--timeout", "--idle-timeout"])
def test_capture_takes_a_timeout_in_range(option: str) -> None:
    args = cli.parser().parse_args(["capture", "t", "out.ackcap", option, "0.5"])
    assert getattr(args, option[2:].replace("-", "_")) == 0.5


@pytest.fixture
def unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Services at addresses where nothing listens, the settings only from here."""
    for key in list(os.environ):
        if key.startswith("ACKLINE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("ACKLINE_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setenv("ACKLINE_DATABASE_URL", "postgresql://127.0.0.1:1/none")


def _kafka_must_not_be_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    def asked(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError("Kafka was contacted before the arguments were checked")

    monkeypatch.setattr(produce, "ensure_topic", asked)
    monkeypatch.setattr(produce, "topic_config_for", asked)


@pytest.mark.usefixtures("unreachable")
@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--events", "-1"], "argument --events: must be a whole number >= 0"),
        (["--partitions", "0"], "argument --partitions: must be a whole number >= 1"),
    ],
)
def test_produce_checks_its_counts_before_kafka(
    argv: list[str],
    named: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Both went to Kafka first (and failed there, or when the topic was created)."""
    _kafka_must_not_be_asked(monkeypatch)
    manifest = str(tmp_path / "m.json")
    with pytest.raises(SystemExit) as refused:  # argparse's refusal
        cli.main(["produce", *argv, "--manifest", manifest, "--quiet"])
    assert refused.value.code == 2
    assert named in capsys.readouterr().err


@pytest.mark.usefixtures("unreachable")
def test_a_refused_produce_leaves_no_folder_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The manifest's missing folders were made before Kafka was asked, and stayed when it
    did not answer."""

    manifest = tmp_path / "absent" / "dir" / "m.json"
    assert cli.main(["produce", "--events", "10", "--manifest", str(manifest)]) == 2
    err = capsys.readouterr().err
    assert "cannot reach Kafka" in err
    assert "check ACKLINE_KAFKA_BOOTSTRAP" in err  # the setting to fix, named
    assert list(tmp_path.iterdir()) == []


@pytest.mark.usefixtures("unreachable")
def test_a_refused_capture_leaves_no_folder_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "absent" / "dir" / "out.ackcap"
    assert cli.main(["capture", "t", str(output), "--timeout", "0.5", "--quiet"]) == 2
    assert "cannot reach Kafka" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "place", ["file/m.json", "file/below/m.json", "dir"], ids=["file", "under-file", "dir"]
)
def test_an_output_path_that_cannot_be_made_is_refused_first(tmp_path: Path, place: str) -> None:
    """Without making the folders, what would stop the writer is still found first."""
    (tmp_path / "file").write_text("")
    (tmp_path / "dir").mkdir()
    with pytest.raises(TargetError, match=r"not a directory|is a directory"):
        check_target(tmp_path / place, what="manifest", overwrite=False)


@pytest.mark.parametrize("value", ["0", "-1"])
def test_replay_refuses_a_partition_count_below_one(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """0 was taken as 'not given' (the source's count used instead), -1 went to Kafka."""
    argv = ["replay", "f.ackcap", "--to", "t", "--create-topic", f"--partitions={value}"]
    with pytest.raises(SystemExit) as stop:
        cli.parser().parse_args(argv)
    assert stop.value.code == 2
    assert "argument --partitions: must be a whole number >= 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("code", "line"),
    [
        (errno.EACCES, "/x: permission denied: choose a writable place, or fix its permissions"),
        (errno.EISDIR, "/x: is a directory: give a file path"),
        (errno.ENOTDIR, "/x: not a directory: a part of the path is a file"),
        (errno.ENOENT, "/x: no such file or directory: check the path"),
        (errno.ENOSPC, "/x: no space left on device: free some space, or choose another place"),
    ],
)
def test_a_path_problem_says_each_thing_once(code: int, line: str) -> None:
    """The fixes repeated the reason: 'is a directory: it is a directory: give a file
    path', 'no such file or directory: no such file or directory'."""
    assert path_problem(OSError(code, os.strerror(code), "/x")) == line


def test_schema_to_a_folder_or_a_missing_one_says_it_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["schema", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("directory") == 1
    assert cli.main(["schema", str(tmp_path / "absent" / "x.json")]) == 2
    assert capsys.readouterr().err.count("no such file or directory") == 1


@pytest.mark.usefixtures("unreachable")
def test_replay_of_a_file_that_cannot_be_read_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    """Reading /proc/self/mem fails with EIO: an OSError traceback, no file named."""
    assert cli.main(["replay", "/proc/self/mem", "--to", "x", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ackline: error: /proc/self/mem: cannot read it (input/output error)")
    assert err.count("\n") == 1


@pytest.mark.usefixtures("unreachable")
@pytest.mark.parametrize(
    ("flag", "line"),
    [
        ([], "no password could be read from the terminal or standard input: type it"),
        (["--password-stdin"], "--password-stdin: no password could be read from standard"),
    ],
    ids=["prompt", "stdin"],
)
def test_set_password_with_no_password_to_read_says_so(
    flag: list[str],
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`ackline roles set-password ackline_ingest </dev/null` with no terminal: getpass
    reads standard input instead, warned (GetPassWarning) and met its end: 'cannot read
    the file: EOFError (truncated or not the expected format)', though no file was read."""
    monkeypatch.setattr(getpass, "getpass", getpass.fallback_getpass)  # as with no terminal
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        assert cli.main(["roles", "set-password", "ackline_ingest", *flag]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"ackline: error: {line}")
    assert [w for w in warned if issubclass(w.category, getpass.GetPassWarning)] == []


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--topic", "demo1", "--group-id", "demo1", "demo"], "--topic and --group-id do"),
        (["demo", "--topic", "demo1"], "--topic does"),
        (["--group-id", "demo1", "demo"], "--group-id does"),
    ],
)
def test_demo_refuses_a_topic_or_group_it_would_not_use(
    argv: list[str], named: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ackline --topic demo1 --group-id demo1 demo` ran into demo-20261205-031718 and
    said nothing of the options it had dropped."""
    import ackline.demo

    def ran(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError("the demo started")

    monkeypatch.setattr(ackline.demo, "demo", ran)
    assert cli.main(argv) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert f"{named} not apply to `ackline demo` (each run produces into a new topic" in err


@pytest.mark.parametrize(
    ("role", "migrate"),
    [("ackline_ingest", True), ("ackline_ingset", False), ("nosuchuser", False)],
)
def test_a_missing_role_is_blamed_on_migrate_only_when_migrate_creates_it(
    role: str, migrate: bool
) -> None:
    """A misspelled user in the URL ('ackline_ingset', 'nosuchuser') was told to run
    `ackline migrate`, which creates only the ackline roles: the fix is the URL."""
    import asyncpg

    from ackline.commands.guard import explain, missing_role

    text = f'role "{role}" does not exist'
    for said in (
        explain(asyncpg.InvalidAuthorizationSpecificationError(text)),
        missing_role(text, "ACKLINE_DATABASE_INGEST_URL"),
    ):
        assert said is not None
        assert ("run `ackline migrate`" in said) is migrate, said
        assert migrate or "check the user in ACKLINE_DATABASE" in said, said


def test_an_erasure_on_a_database_never_migrated_says_to_migrate() -> None:
    """`ackline erase` on a fresh cluster said `nothing was erased: role "ackline_eraser"
    does not exist`, with no fix; a missing erasures table likewise. The fix is added by
    the one place that tells a database never migrated (commands/guard.py); other
    failures read as they are."""
    import asyncpg

    from ackline.commands.guard import with_migrate_fix

    for exc in (
        asyncpg.UndefinedObjectError('role "ackline_eraser" does not exist'),
        asyncpg.UndefinedTableError('relation "erasures" does not exist'),
    ):
        line = with_migrate_fix(f"nothing was erased: {exc}", exc, "it creates the roles")
        assert line.startswith(f"nothing was erased: {exc}: "), line
        assert "run `ackline migrate`" in line
    denied = asyncpg.InsufficientPrivilegeError("permission denied for table activity")
    assert with_migrate_fix(f"nothing was erased: {denied}", denied) == (
        "nothing was erased: permission denied for table activity"
    )
    other = asyncpg.UndefinedObjectError('role "someone" does not exist')
    assert with_migrate_fix("x", other) == "x"


def test_the_migrate_hint_names_the_setting_the_connection_came_from() -> None:
    """`process` on a database never migrated, connected by ACKLINE_DATABASE_PROCESSOR_URL,
    was told to point ACKLINE_DATABASE_URL "at this database", naming no database."""
    from ackline.commands.guard import migrate_hint, missing_role

    assert "ACKLINE_DATABASE_URL pointing at this database" in migrate_hint()
    hint = migrate_hint("ACKLINE_DATABASE_PROCESSOR_URL")
    assert "the database of ACKLINE_DATABASE_PROCESSOR_URL" in hint, hint
    said = missing_role('role "ackline_ingest" does not exist', "ACKLINE_DATABASE_INGEST_URL")
    assert "ACKLINE_DATABASE_INGEST_URL" in said, said


def test_an_outage_names_the_setting_its_url_came_from() -> None:
    """`process` with PostgreSQL away logged 'check ACKLINE_DATABASE_URL' while it
    connects with ACKLINE_DATABASE_PROCESSOR_URL: the hint names the setting it is given."""
    import asyncio
    import logging

    from ackline.commands.guard import DatabaseUnavailableError, Outage

    async def refused() -> NoReturn:
        raise ConnectionRefusedError(111, "Connection refused")

    outage = Outage(
        "postgresql://p@127.0.0.1:1/x",
        0.0,
        True,
        logging.getLogger("t"),
        setting="ACKLINE_DATABASE_PROCESSOR_URL",
    )
    with pytest.raises(DatabaseUnavailableError, match="check ACKLINE_DATABASE_PROCESSOR_URL"):
        asyncio.run(outage.wrap(refused)())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["tail", "--reader", ""], "--reader"),
        (["tail", "--reader="], "--reader"),
        (["tail", "--from-cursor", ""], "--from-cursor"),
        (["dispatch", "--reader", ""], "--reader"),
        (["dispatch", "--instance", ""], "--instance"),
        (["process", ""], "NAME"),
        (["process", "runs", "--instance", ""], "--instance"),
        (["process", "runs", "--from-cursor", ""], "--from-cursor"),
        (["processors", "status", "runs", ""], "NAME"),
        (["processors", "pause", ""], "name"),
        (["processors", "resume", ""], "name"),
        (["processors", "clear-superseded", ""], "name"),
        (["processors", "reset", ""], "name"),
        (["processors", "reset", "runs", "--to-cursor", ""], "--to-cursor"),
        (["processors", "setup", ""], "name"),
    ],
)
def test_an_empty_reader_processor_instance_or_cursor_is_refused(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ackline tail --reader ""` was taken as no reader: it printed the feed from its
    start (with --commit: '--commit needs --reader NAME'); `--to-cursor ""` rewound to the
    start, `--instance ""` fell back to ACKLINE_WORKER_ID. feed_cursors has
    CHECK (reader <> '')."""
    with pytest.raises(SystemExit) as stop:
        cli.parser().parse_args(argv)
    assert stop.value.code == 2
    assert f"argument {option}: must not be empty" in capsys.readouterr().err


@pytest.mark.usefixtures("unreachable")
def test_reset_refuses_skip_events_without_cursor_only(capsys: pytest.CaptureFixture[str]) -> None:
    """`processors reset NAME --skip-events` without --cursor-only dropped the flag and
    cleared the processor's whole state (exit 0). Refused before PostgreSQL is asked
    (here it is not there: asked, the line would say it cannot be reached)."""
    assert cli.main(["processors", "reset", "runs", "--skip-events"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("ackline: error: --skip-events needs --cursor-only (")
    assert err.count("\n") == 1


@pytest.mark.usefixtures("unreachable")
def test_replay_refuses_partitions_without_create_topic(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`replay ... --partitions 3` without --create-topic was dropped ('partitions: as
    captured', exit 0): an existing topic keeps its count."""
    _kafka_must_not_be_asked(monkeypatch)
    argv = ["replay", "/nonexistent.ackcap", "--to", "t", "--partitions", "3", "--quiet"]
    assert cli.main(argv) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("ackline: error: replay: --partitions needs --create-topic (")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("90", "'90' has no unit: give one, like 90d, 90w or 36h"),
        (" 7 ", "' 7 ' has no unit"),
        ("23h", "must be at least a day (1d)"),
        ("90 days", "'90 days' is not a duration like 90d, 12w or 36h"),
    ],
)
def test_retention_apply_refuses_a_period_without_its_unit(
    value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`retention apply --older-than 90` was taken as 90 days and saved as the policy,
    though the help shows only 90d, 12w, 36h: hours or weeks may have been meant."""
    with pytest.raises(SystemExit) as stop:
        cli.parser().parse_args(["retention", "apply", f"--older-than={value}"])
    assert stop.value.code == 2
    assert f"argument --older-than: {said}" in capsys.readouterr().err


def test_retention_apply_takes_a_period_with_its_unit() -> None:
    from datetime import timedelta

    args = cli.parser().parse_args(["retention", "apply", "--older-than", "12w"])
    assert args.older_than == timedelta(weeks=12)
