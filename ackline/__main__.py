"""`python -m ackline`, and the `ackline` command's entry point.

A Ctrl-C before the CLI has its handlers (while its modules import, ~0.5 s of the
start) ends it with 130 and no traceback, as one a moment later does
(:func:`ackline.cli.main`)."""


def launch() -> int:
    try:
        from ackline.cli import main
    except KeyboardInterrupt:
        return 130
    return main()


if __name__ == "__main__":
    raise SystemExit(launch())
