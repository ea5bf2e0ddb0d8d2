"""The `ackline` command line. Thin: parse, load settings, call one handler, exit.

Global options (``-v``, ``--config``, ``--log-format``, ``--topic``, ``--group-id``) are
accepted before or after the subcommand; ``--topic`` and ``--group-id`` only by a command
that reads that setting (:func:`misapplied`). An expected failure is one line on stderr
naming the problem and the fix (``ackline.commands.guard``) and a non-zero status,
never a traceback; SIGTERM stops a command as Ctrl-C does (cleanup runs, status 143).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from ackline.commands import MODULES, Handler, Uses
from ackline.commands.guard import explain
from ackline.core import early
from ackline.core.errors import AcklineError, Terminated
from ackline.core.logs import KAFKA_LOGGER, REFUSED_EXIT, configure_logging, refusal_line
from ackline.core.signals import begin_work, done_status, terminate_as_exit
from ackline.settings import load_settings

SERVICES = frozenset({"run", "process", "dispatch"})
"""Commands that run until stopped: librdkafka's (de-duplicated) lines are part of their
log, and a stop request is a clean stop (status 0) even before they took the signals;
not when told to end by themselves (:data:`RUN_TO_END`)."""
RUN_TO_END = ("once", "until_caught_up")
"""The options that make a service a job that ends once caught up (`dispatch --once`,
`process --until-caught-up`): a stop before then is not success (130/143), as for the
commands that end on their own."""
GLOBAL_SETTINGS = (("--topic", "global_topic", "topic"), ("--group-id", "group_id", "group_id"))
"""(option, its dest, the setting it overrides) of the global options a command may not read."""
EXIT_ERROR = REFUSED_EXIT
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM
DESCRIPTION = (
    "Move agent activity events from Kafka into PostgreSQL exactly once, and read them "
    "back: `ackline COMMAND --help` for each command; docs/operating.md for every setting."
)
"""What `ackline --help` says (the module docstring is for the code's readers)."""


def _global_options(p: argparse.ArgumentParser, suppress: bool) -> None:
    """The options every subcommand accepts too. Under a subcommand their defaults are
    SUPPRESS, so a value given before the subcommand is not reset by its parser."""
    default: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging", **default)
    p.add_argument(
        "--config",
        metavar="PATH",
        help="TOML settings file (else ACKLINE_CONFIG_FILE); environment variables win over it",
        **default,
    )
    p.add_argument(
        "--log-format",
        choices=("auto", "json", "text"),
        help="override ACKLINE_LOG_FORMAT (auto: text on a terminal, else JSON lines)",
        **default,
    )
    p.add_argument(
        "--topic",
        dest="global_topic",
        metavar="TOPIC",
        help="override ACKLINE_TOPIC (a command that does not read it refuses it)",
        **default,
    )
    p.add_argument(
        "--group-id",
        help="override ACKLINE_GROUP_ID (a command that does not read it refuses it)",
        **default,
    )


def _describe(p: argparse.ArgumentParser) -> None:
    """Give every subcommand without a description of its own its line from the list
    above it: `ackline run --help` (and twenty-odd others) said only its usage."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for listed in action._choices_actions:
                child = action.choices[listed.dest]
                if not child.description and listed.help:
                    child.description = listed.help
                _describe(child)


def _subparsers(p: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every parser below ``p``, at any depth."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                yield child
                yield from _subparsers(child)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but a bad argument is one line naming the command's --help,
    not the command's whole usage (nine lines for `process`) above the one that matters.
    Subcommands' parsers are of this class too (add_subparsers makes its own type)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` says more)\n")

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """As argparse's, but an option the command does not know is said as that
        command's error (a subcommand hands what it does not know up to the root, which
        named the root's --help for `ackline process runs --batch-event 5`)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            prog = getattr(parsed, "command_prog", None) or self.prog
            self.exit(
                2,
                f"{prog}: error: unrecognized arguments: {' '.join(extras)} "
                f"(`{prog} --help` says more)\n",
            )
        return parsed


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ackline", description=DESCRIPTION)
    _global_options(p, suppress=False)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in MODULES:
        importlib.import_module(f"ackline.commands.{name}").register(sub)
    _describe(p)
    for child in _subparsers(p):
        _global_options(child, suppress=True)
        # set on each parser, so that a subcommand never inherits its group's: an
        # undeclared one refuses both options (misapplied)
        child.set_defaults(global_uses=child.get_default("global_uses"), command_prog=child.prog)
    return p


def misapplied(args: argparse.Namespace) -> str | None:
    """The error line for ``--topic`` / ``--group-id`` given to a command that does not
    read that setting (:func:`ackline.commands.uses`), or None. The command would have
    run as if the option were not there. ACKLINE_TOPIC or a config file's topic is not
    refused: a deployment sets it for every command. Pure."""
    declared: Uses | None = getattr(args, "global_uses", None)
    reads = declared.settings if declared is not None else frozenset()
    given = [
        option
        for option, dest, setting in GLOBAL_SETTINGS
        if getattr(args, dest, None) is not None and setting not in reads
    ]
    if not given:
        return None
    verb = "does" if len(given) == 1 else "do"
    why = f" ({declared.why})" if declared is not None and declared.why else ""
    return f"{' and '.join(given)} {verb} not apply to `{args.command_prog}`{why}"


def _quiet_stdout() -> None:
    """stdout's reader left (`| head`): send what is still buffered nowhere, so the
    interpreter's final flush does not fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _fail(line: str) -> int:
    print(refusal_line(line), file=sys.stderr, flush=True)
    return EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    begin_work()
    args: argparse.Namespace | None = None  # a Ctrl-C in the parser: before anything ran
    try:
        args = parser().parse_args(argv)  # it imports every command: ~0.3 s
        if early.stopped:  # a stop that landed in those imports (ackline.__main__)
            return _stopped(args, EXIT_TERMINATED)
        refused = misapplied(args)
        if refused is not None:
            return _fail(refused)
        overrides: dict[str, Any] = {
            "topic": args.global_topic,
            "group_id": args.group_id,
            "config_file": args.config,
            "log_format": args.log_format,
        }
        with terminate_as_exit():
            settings = load_settings(**overrides)
            configure_logging(settings.log_format, verbose=args.verbose, stream=sys.stderr)
            if args.command not in SERVICES and not args.verbose:
                # a one-shot command ends with its own error line; librdkafka's retries
                # on the way there are noise (-v shows them)
                logging.getLogger(KAFKA_LOGGER).setLevel(logging.CRITICAL)
            handler: Handler = args.handler
            status = handler(args, settings)
            sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
            return status
    except BrokenPipeError:
        _quiet_stdout()
        return 0
    except AcklineError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return _stopped(args, EXIT_INTERRUPTED)
    except Terminated:
        # a service stopped before its runtime took over the signal (start-up): a clean
        # stop, as the runtime's own handling gives
        return _stopped(args, EXIT_TERMINATED)
    except Exception as exc:
        stopped = _while_stopping(exc)
        if stopped is not None:
            # cleanup after a stop request failed on what the stop interrupted (a client
            # cut mid-call): the stop is the news, not the cleanup's failure
            return _stopped(args, stopped)
        line = explain(exc)
        if line is None:
            raise
        return _fail(line)


def _stopped(args: argparse.Namespace | None, status: int) -> int:
    """The exit status of a command a stop ended with ``status`` (130, 143): the one its
    work recorded if the work was over (:func:`~ackline.core.signals.work_done`: the stop
    came as it wound down), 0 for a service, else ``status``."""
    done = done_status()
    if done is not None:
        return done
    return 0 if _runs_until_stopped(args) else status


def _runs_until_stopped(args: argparse.Namespace | None) -> bool:
    """A service run as one (not as a job that ends once caught up): a stop is its end."""
    if args is None or args.command not in SERVICES:
        return False
    return not any(getattr(args, o, False) for o in RUN_TO_END)


def _while_stopping(exc: BaseException) -> int | None:
    """The status of the stop request (SIGTERM, Ctrl-C) ``exc`` was raised while handling
    (143, 130), or None when it was not raised so."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, Terminated):
            return EXIT_TERMINATED
        if isinstance(cause, KeyboardInterrupt):
            return EXIT_INTERRUPTED
        seen.add(id(cause))
        shown = None if cause.__suppress_context__ else cause.__context__
        cause = cause.__cause__ or shown
    return None


if __name__ == "__main__":
    raise SystemExit(main())
