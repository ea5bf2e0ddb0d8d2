"""`ackline roles`: the PostgreSQL roles of the roles migration, and their passwords.

``show`` lists the roles and connects as the worker would (the ingest DSN) to report
who it is and whether it could rewrite activity rows. ``set-password ROLE`` gives a
LOGIN role a SCRAM password (only its verifier is sent); the password comes from
``--password-stdin``, from ``ACKLINE_DATABASE_INGEST_URL`` (``--from-ingest-url``,
for ``ackline_ingest``) or from a prompt. Both connect with the operator's DSN.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import warnings
from dataclasses import asdict, dataclass

from ackline.clients import ingest_dsn
from ackline.commands import Subparsers, uses
from ackline.commands.guard import connect
from ackline.core.errors import AcklineError
from ackline.core.signals import run_stoppable
from ackline.endpoints import database
from ackline.roles import RoleState
from ackline.settings import Settings


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What the worker's DSN connects as: None user when it cannot connect."""

    user: str | None
    may_rewrite_activity: list[str]
    error: str = ""


async def _show(dsn: str, worker_dsn: str, timeout: float) -> tuple[list[RoleState], WorkerView]:
    import asyncpg

    from ackline.roles import role_states
    from ackline.sinks.admin.grants import may_modify_activity

    conn = await connect(dsn, timeout=timeout)
    try:
        states = await role_states(conn)
    finally:
        await conn.close()
    try:
        conn = await asyncpg.connect(worker_dsn, timeout=timeout)
    except (asyncpg.PostgresError, OSError) as exc:
        return states, WorkerView(None, [], type(exc).__name__)
    try:
        user, held = await may_modify_activity(conn)
    finally:
        await conn.close()
    return states, WorkerView(user, held)


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    dsn = database(settings)
    states, worker = run_stoppable(
        _show(dsn, ingest_dsn(settings, dsn), settings.db_connect_timeout_s)
    )
    if getattr(args, "json", False):
        print(json.dumps({"roles": [asdict(s) for s in states], "worker": asdict(worker)}))
    else:
        for s in states:
            state = ("login" if s.login else "nologin") if s.exists else "MISSING"
            print(f"{s.name:<18} {state:<8} members: {', '.join(s.members) or '-'}")
        if worker.user is None:
            print(f"the worker cannot connect with its DSN ({worker.error})")
        else:
            rights = "/".join(worker.may_rewrite_activity) or "nothing"
            print(f"the worker connects as {worker.user}; may rewrite activity: {rights}")
    return 0 if worker.user is not None and not worker.may_rewrite_activity else 1


def _password(args: argparse.Namespace, settings: Settings) -> str:
    from ackline.roles import dsn_password, dsn_user

    if args.password_stdin:
        line = sys.stdin.readline()
        if not line:
            raise AcklineError(
                "--password-stdin: no password could be read from standard input (it is "
                "empty): give the password there as one line"
            )
        password = line.rstrip("\r\n")
    elif args.from_ingest_url:
        url = settings.database_ingest_url
        secret = None if url is None else url.get_secret_value()
        if secret is None or dsn_user(secret) != args.role or dsn_password(secret) is None:
            raise AcklineError(
                f"--from-ingest-url needs ACKLINE_DATABASE_INGEST_URL with user {args.role} "
                "and a password"
            )
        password = dsn_password(secret) or ""
    else:
        password = _prompted(args.role)
    if not password:
        raise AcklineError("an empty password is not allowed")
    if not (password.isascii() and password.isprintable()):
        raise AcklineError("only printable ASCII passwords; use ALTER ROLE ... PASSWORD for others")
    return password


def _prompted(role: str) -> str:
    """The password typed twice. With no terminal getpass reads standard input instead,
    and there an empty input ended in EOFError, reported as an unreadable file."""
    try:
        with warnings.catch_warnings():
            # 'Can not control echo': getpass prints its own one-line warning as well
            warnings.simplefilter("ignore", getpass.GetPassWarning)
            password = getpass.getpass(f"new password for {role}: ")
            again = getpass.getpass("again: ")
    except EOFError:
        print(file=sys.stderr, flush=True)  # end the prompt's line
        raise AcklineError(
            "no password could be read from the terminal or standard input: type it on a "
            "terminal, or pass --password-stdin (the password as one line) or "
            "--from-ingest-url"
        ) from None
    if again != password:
        raise AcklineError("the passwords differ")
    return password


def cmd_set_password(args: argparse.Namespace, settings: Settings) -> int:
    from ackline.roles import set_password

    password = _password(args, settings)
    dsn = database(settings)

    async def go() -> None:
        conn = await connect(dsn, timeout=settings.db_connect_timeout_s)
        try:
            await set_password(conn, args.role, password)
        finally:
            await conn.close()

    run_stoppable(go())
    print(f"password of {args.role} set")
    return 0


def register(sub: Subparsers) -> None:
    from ackline.roles import LOGIN_ROLES

    p = sub.add_parser(
        "roles", help="PostgreSQL roles: show them (the default), set their passwords"
    )
    p.set_defaults(handler=cmd_show)
    actions = p.add_subparsers(dest="action", metavar="{show,set-password}")
    show = actions.add_parser("show", help="the roles, and what the worker connects as")
    show.add_argument("--json", action="store_true", help="one JSON object")
    show.set_defaults(handler=cmd_show)
    setp = actions.add_parser("set-password", help="give a LOGIN role a SCRAM password")
    setp.add_argument("role", choices=LOGIN_ROLES, help="the role whose password to set")
    source = setp.add_mutually_exclusive_group()
    source.add_argument(
        "--password-stdin", action="store_true", help="read the password as one line of stdin"
    )
    source.add_argument(
        "--from-ingest-url",
        action="store_true",
        help="the password of ACKLINE_DATABASE_INGEST_URL (role ackline_ingest)",
    )
    setp.set_defaults(handler=cmd_set_password)
    for each in (p, show, setp):
        uses(each, why="PostgreSQL's roles serve every topic and group")
