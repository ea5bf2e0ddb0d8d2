"""No SQL text is ever built from event content: a static check of sinks/ and streams/.

Every asyncpg call that takes SQL (``execute``, ``fetch*``, ``copy_*``, ...) must get, as
its SQL argument, a string literal, a module-level constant, or an f-string / ``+`` of
those only. Values travel as bind parameters ($1, $2 ...) or COPY records, never in the
text. ``.format``, ``%`` and any local or computed string fail the check.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sinks", "streams")
SQL_METHODS = frozenset(
    {
        "execute",
        "executemany",
        "fetch",
        "fetchval",
        "fetchrow",
        "prepare",
        "cursor",
        "copy_records_to_table",
        "copy_to_table",
        "copy_from_table",
        "copy_from_query",
    }
)
# (file, SQL argument as written): the only dynamic SQL, and why it is not event content.
ALLOWED = {
    # The migration files shipped in schemas/sql, applied verbatim by the migrator.
    ("sinks/admin/migrate.py", "migration.sql"),
}


def _module_constants(tree: ast.Module) -> dict[str, ast.expr]:
    """Names bound exactly once at module level, to the expression bound."""
    seen: dict[str, list[ast.expr]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    seen.setdefault(target.id, []).append(node.value)
        elif (
            isinstance(node, ast.AnnAssign)
            and node.value is not None
            and isinstance(node.target, ast.Name)
        ):
            seen.setdefault(node.target.id, []).append(node.value)
    rebound = {
        n.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id in seen
    }
    # A name also assigned inside a function is not a constant.
    inner = {
        n.id
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        for n in ast.walk(fn)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    return {k: v[0] for k, v in seen.items() if len(v) == 1 and not (k in rebound and k in inner)}


def is_static(node: ast.expr, constants: dict[str, ast.expr], depth: int = 0) -> bool:
    """True when ``node`` evaluates to the same text on every call (code constants only)."""
    if depth > 20:
        return False
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Name):
        value = constants.get(node.id)
        return value is not None and is_static(value, constants, depth + 1)
    if isinstance(node, ast.JoinedStr):
        return all(
            isinstance(part, ast.Constant)
            or (
                isinstance(part, ast.FormattedValue)
                and part.format_spec is None
                and is_static(part.value, constants, depth + 1)
            )
            for part in node.values
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return is_static(node.left, constants, depth + 1) and is_static(
            node.right, constants, depth + 1
        )
    return False


def sql_calls() -> list[tuple[str, int, ast.expr | None, bool]]:
    """(file, line, SQL argument, static?) for every SQL-taking call in PACKAGES."""
    found: list[tuple[str, int, ast.expr | None, bool]] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            constants = _module_constants(tree)
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(tree):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in SQL_METHODS
                ):
                    continue
                arg = node.args[0] if node.args else None
                if arg is None:
                    for kw in node.keywords:
                        if kw.arg in ("query", "table_name"):
                            arg = kw.value
                ok = arg is not None and (
                    is_static(arg, constants) or (rel, ast.unparse(arg)) in ALLOWED
                )
                found.append((rel, node.lineno, arg, ok))
    return found


def test_every_sql_argument_is_static() -> None:
    calls = sql_calls()
    files = {f for f, _, _, _ in calls}
    # Not vacuous: the writer, offsets and migration modules are all seen.
    assert {"sinks/ingest/writer.py", "sinks/ingest/offsets.py", "sinks/admin/migrate.py"} <= files
    assert len(calls) >= 20
    bad = [
        f"{f}:{line}: {ast.unparse(arg) if arg is not None else '<no SQL argument>'}"
        for f, line, arg, ok in calls
        if not ok
    ]
    assert not bad, "SQL built at run time:\n" + "\n".join(bad)


def _check(source: str) -> bool:
    tree = ast.parse(source)
    constants = _module_constants(tree)
    call = next(
        n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    )
    return is_static(call.args[0], constants)


def test_the_check_catches_built_sql() -> None:
    assert _check('Q = "SELECT 1"\nasync def f(c):\n    await c.fetch(Q)')
    assert _check('A = "a"\nB = f"SELECT {A}"\nasync def f(c):\n    await c.fetch(B + " x")')
    assert not _check('async def f(c, t):\n    await c.fetch(f"SELECT {t}")')
    assert not _check('async def f(c, t):\n    await c.fetch("SELECT %s" % t)')
    assert not _check('async def f(c, t):\n    await c.fetch("SELECT {}".format(t))')
    assert not _check('async def f(c, t):\n    await c.execute("SELECT " + t)')
    assert not _check("async def f(c, row):\n    await c.execute(row.sql)")
    assert not _check('Q = "x"\nasync def f(c):\n    Q = input()\n    await c.fetch(Q)')
