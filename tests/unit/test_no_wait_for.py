"""No ``asyncio.wait_for`` in the product: a static check of every package that runs.

On Python 3.11 ``wait_for`` can swallow a cancellation: when the awaited future finishes
in the same loop turn as the task is cancelled, it returns the result and the
``CancelledError`` is gone (CPython gh-86296, fixed in 3.12 by reimplementing it on
``asyncio.timeout``). A health or lag loop that loses its cancellation that way keeps
running after shutdown asked it to end, and a ``close()`` under it returns as if nothing
had been asked. ``async with asyncio.timeout(...)`` counts cancellations
(``Task.uncancel``) and never drops one, so the product uses only that.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ackline", "sinks", "streams", "schemas", "load")


def _product_files() -> list[Path]:
    """Every module once (ackline/<x> symlinks to the top-level packages)."""
    return sorted(
        {path.resolve() for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    )


def _wait_for_uses(tree: ast.Module) -> list[int]:
    """Line numbers of ``asyncio.wait_for(...)`` and of ``wait_for`` imported from asyncio."""
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "wait_for"
            and isinstance(node.value, ast.Name)
            and node.value.id == "asyncio"
        ):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "asyncio":
            lines.extend(node.lineno for alias in node.names if alias.name == "wait_for")
    return lines


def test_the_scan_finds_what_it_looks_for() -> None:
    source = "import asyncio\nfrom asyncio import wait_for\nasyncio.wait_for(f, 1)\n"
    assert sorted(_wait_for_uses(ast.parse(source))) == [2, 3]


def test_the_product_never_calls_asyncio_wait_for() -> None:
    files = _product_files()
    assert len(files) > 100, "the scan found too few product files"
    found = [
        f"{path.relative_to(ROOT.resolve())}:{line}"
        for path in files
        for line in _wait_for_uses(ast.parse(path.read_text(), str(path)))
    ]
    assert not found, (
        "asyncio.wait_for can drop a cancellation on Python 3.11; use "
        f"`async with asyncio.timeout(...)` instead: {found}"
    )


def test_a_cancellation_landing_as_the_awaited_work_ends_is_kept() -> None:
    """What the rule relies on: under ``asyncio.timeout`` the race above still cancels."""

    async def main() -> str:
        work: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def waiter() -> str:
            async with asyncio.timeout(5):
                await work
            return "went on"

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0)
        work.set_result(1)  # the work ends and the cancellation lands in one loop turn
        task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            return "cancelled"

    assert asyncio.run(main()) == "cancelled"
