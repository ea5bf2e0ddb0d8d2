"""The `ackline` command line. Thin: parse, load settings, call one handler, exit."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from ackline.commands import MODULES, Handler
from ackline.core.errors import AcklineError
from ackline.core.logs import configure_logging
from ackline.settings import load_settings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ackline", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument(
        "--config",
        metavar="PATH",
        help="TOML settings file (else ACKLINE_CONFIG_FILE); environment variables win over it",
    )
    p.add_argument(
        "--log-format",
        choices=("auto", "json", "text"),
        help="override ACKLINE_LOG_FORMAT (auto: text on a terminal, else JSON lines)",
    )
    p.add_argument("--topic", help="override ACKLINE_TOPIC")
    p.add_argument("--group-id", help="override ACKLINE_GROUP_ID")
    sub = p.add_subparsers(dest="command", required=True)
    for name in MODULES:
        importlib.import_module(f"ackline.commands.{name}").register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    overrides: dict[str, Any] = {
        "topic": args.topic,
        "group_id": args.group_id,
        "config_file": args.config,
        "log_format": args.log_format,
    }
    try:
        settings = load_settings(**overrides)
        configure_logging(settings.log_format, verbose=args.verbose, stream=sys.stderr)
        handler: Handler = args.handler
        return handler(args, settings)
    except AcklineError as exc:
        print(f"ackline: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
