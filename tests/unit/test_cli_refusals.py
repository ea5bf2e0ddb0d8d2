"""Arguments an operator probe found accepted, or refused badly: each is refused at once,
in one line naming the argument and the fix, before any service is contacted."""

from __future__ import annotations

import pytest

from ackline import cli


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
