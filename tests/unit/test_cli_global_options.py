"""The global --topic and --group-id are refused by a command that does not read them.

An operator probe: `ackline --topic X dispatch`, `ackline --group-id G tail` (and more)
ran as if the option had not been given, and the user took it to have worked. Each
command declares what it reads (ackline.commands.uses); the rest is refused before the
settings load, in one line naming the option and the command, exit 2.
"""

from __future__ import annotations

import argparse

import pytest

from ackline import cli

T, G = "topic", "group_id"
COMMANDS: list[tuple[str, list[str], set[str]]] = [
    # (the command, the arguments it needs, the settings its handler reads)
    ("migrate", [], set()),
    ("run", [], {T, G}),
    ("produce", [], {T}),
    ("verify", [], {G}),  # the topic is the manifest's
    ("schema", [], set()),
    ("demo", [], set()),  # its own topic and group each run
    ("dev", ["up"], set()),
    ("tail", ["--from-start"], set()),
    ("dispatch", [], set()),
    ("config", [], {T, G}),  # shows them
    ("config show", [], {T, G}),
    ("config reference", [], set()),
    ("status", [], {T, G}),
    ("conflicts", [], {G}),
    ("conflicts list", [], {G}),
    ("conflicts show", ["1"], {G}),
    ("rejects", [], {G}),
    ("rejects list", [], {G}),
    ("rejects show", ["1"], {G}),
    ("doctor", [], {T, G}),
    ("roles", [], set()),
    ("roles show", [], set()),
    ("roles set-password", ["ackline_ingest"], set()),
    ("capture", ["source", "out.ackcap"], set()),  # the topic is its argument
    ("replay", ["in.ackcap", "--to", "target"], {T}),  # --to must not be it
    ("chaos", [], set()),  # its own stack
    ("process", ["runs"], set()),
    ("processors list", [], set()),
    ("processors status", [], set()),
    ("processors pause", ["runs"], set()),
    ("processors resume", ["runs"], set()),
    ("processors clear-superseded", ["runs"], set()),
    ("processors reset", ["runs"], set()),
    ("processors setup", ["runs"], set()),
    ("retention apply", [], set()),
    ("retention show", [], set()),
    ("partitions list", [], set()),
    ("partitions ensure", [], set()),
    ("erase", ["--agent", "a1"], set()),
    ("offsets adopt-topic", [], {T, G}),
]
OPTIONS = {T: "--topic", G: "--group-id"}


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return cli.parser()


def _ends_a_command(p: argparse.ArgumentParser) -> bool:
    """A parser a command line can end at: a group whose subcommand is required is not."""
    return not any(isinstance(a, argparse._SubParsersAction) and a.required for a in p._actions)


def test_every_command_declares_what_it_reads(parser: argparse.ArgumentParser) -> None:
    """A new command must say whether it reads the topic and the group id: undeclared, it
    refuses both (ackline.commands.uses)."""
    ends = [p for p in cli._subparsers(parser) if _ends_a_command(p)]
    undeclared = [p.prog for p in ends if p.get_default("global_uses") is None]
    assert undeclared == []
    assert sorted(p.prog for p in ends) == sorted(f"ackline {c}" for c, _, _ in COMMANDS)


@pytest.mark.parametrize(("command", "needs", "reads"), COMMANDS, ids=[c for c, _, _ in COMMANDS])
@pytest.mark.parametrize("setting", [T, G])
@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
def test_a_global_option_is_refused_where_it_is_not_read(
    parser: argparse.ArgumentParser,
    command: str,
    needs: list[str],
    reads: set[str],
    setting: str,
    before: bool,
) -> None:
    """Before the subcommand or after it, the same decision."""
    argv, option = [*command.split(), *needs], [OPTIONS[setting], "x1"]
    args = parser.parse_args([*option, *argv] if before else [*argv, *option])
    line = cli.misapplied(args)
    if setting in reads:
        assert line is None
    else:
        assert line is not None
        assert line.startswith(f"{OPTIONS[setting]} does not apply to `ackline {command}`")
        assert "\n" not in line


@pytest.mark.parametrize(("command", "needs", "reads"), COMMANDS, ids=[c for c, _, _ in COMMANDS])
def test_no_global_option_is_no_refusal(
    parser: argparse.ArgumentParser, command: str, needs: list[str], reads: set[str]
) -> None:
    assert cli.misapplied(parser.parse_args([*command.split(), *needs])) is None


def test_both_options_are_named_in_one_line(parser: argparse.ArgumentParser) -> None:
    args = parser.parse_args(["--topic", "t1", "tail", "--from-start", "--group-id", "g1"])
    line = cli.misapplied(args)
    assert line is not None
    assert line.startswith("--topic and --group-id do not apply to `ackline tail`")


def test_an_undeclared_command_refuses_both() -> None:
    """The safe default: ackline.cli.parser() sets an undeclared parser's declaration to
    None (never its group's), which refuses both options."""
    for topic, group in (("t1", None), (None, "g1")):
        args = argparse.Namespace(
            global_topic=topic, group_id=group, global_uses=None, command_prog="ackline new"
        )
        assert (
            cli.misapplied(args)
            == f"{'--topic' if topic else '--group-id'} does not apply to `ackline new`"
        )


class _SettingsLoaded(Exception):
    """The command got past the check: its settings were being loaded."""


def _no_settings(**overrides: object) -> None:
    raise _SettingsLoaded(overrides)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["--topic", "x1", "dispatch", "--once"],
            "--topic does not apply to `ackline dispatch`",
        ),
        (
            ["tail", "--from-start", "--group-id", "g1"],
            "--group-id does not apply to `ackline tail`",
        ),
        (
            ["--topic", "x1", "--group-id", "g1", "process", "runs"],
            "--topic and --group-id do not apply to `ackline process`",
        ),
        (
            ["processors", "status", "--topic", "x1"],
            "--topic does not apply to `ackline processors status`",
        ),
        (["--group-id", "g1", "dev", "up"], "--group-id does not apply to `ackline dev`"),
        (
            ["--topic", "x1", "conflicts", "list"],
            "--topic does not apply to `ackline conflicts list`",
        ),
        (["--group-id", "g1", "produce"], "--group-id does not apply to `ackline produce`"),
    ],
)
def test_main_refuses_before_anything_runs(
    argv: list[str], line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One line on stderr, exit 2, before the settings load (nothing was contacted)."""
    monkeypatch.setattr(cli, "load_settings", _no_settings)
    assert cli.main(argv) == cli.EXIT_ERROR
    captured = capsys.readouterr()
    assert captured.out == ""
    [said] = captured.err.splitlines()
    assert said.startswith(f"ackline: error: {line}")


@pytest.mark.parametrize(
    "argv",
    [
        ["--topic", "x1", "--group-id", "g1", "run"],
        ["status", "--topic", "x1", "--group-id", "g1"],
        ["--group-id", "g1", "rejects", "show", "3"],
        ["--topic", "x1", "produce"],
        ["--topic", "x1", "config", "show"],
    ],
)
def test_main_passes_on_what_a_command_reads(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "load_settings", _no_settings)
    with pytest.raises(_SettingsLoaded):
        cli.main(argv)


@pytest.mark.parametrize(
    ("variable", "value"), [("ACKLINE_TOPIC", "x1"), ("ACKLINE_GROUP_ID", "g1")]
)
def test_a_topic_or_group_from_the_environment_is_not_refused(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ACKLINE_TOPIC and ACKLINE_GROUP_ID (or the config file's keys) are set for every
    command of a deployment: only the explicit option is a mistake."""
    monkeypatch.setenv(variable, value)
    monkeypatch.setattr(cli, "load_settings", _no_settings)
    with pytest.raises(_SettingsLoaded):
        cli.main(["tail", "--from-start"])
