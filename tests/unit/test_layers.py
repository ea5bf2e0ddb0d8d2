"""The house has floors, and imports only go down (docs/design.md, "Layers").

Every module of the one import root ``ackline`` belongs to one floor; a module may import
modules of its own floor or of a floor below it, never above (type-only imports count:
a cycle through annotations is still a cycle). And the production import graph — what
a worker loads — never reaches the dev stack.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import ackline

ROOT = Path(ackline.__file__).parent

FLOORS: tuple[tuple[str, ...], ...] = (
    ("ackline.core",),  # the ground floor: errors, faults, logs, metrics, progress, tasks
    ("ackline.schemas",),  # the event schema, canonical hash, decoder
    ("ackline.sinks",),  # PostgreSQL: ingest, changefeed, administration
    ("ackline.streams",),  # Kafka: the runtimes' shared parts, producer SDK, dead letters
    ("ackline.dev",),  # the local stack (tests, demo, chaos, bench)
    ("ackline.load",),  # load generation, verification, capture/replay, chaos, bench
    ("ackline.settings", "ackline.roles", "ackline.clients"),  # configuration
    ("ackline.runtime",),  # composition of a worker: wiring, both runtimes, health, HTTP
    (  # the shell: the command line and the operator commands
        "ackline.cli",
        "ackline.commands",
        "ackline.demo",
        "ackline.doctor",
        "ackline.status",
        "ackline.render",
        "ackline.endpoints",
        "ackline.__main__",
    ),
)
PRODUCTION = ("ackline.runtime",)  # what `ackline run` loads, transitively


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder, _dirs, files in os.walk(ROOT, followlinks=True):
        for name in files:
            if not name.endswith(".py"):
                continue
            rel = (Path(folder) / name).relative_to(ROOT.parent).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = Path(folder) / name
    return found


MODULES = _modules()


def _imports(module: str, path: Path) -> set[str]:
    """Every ackline module ``module`` imports, anywhere in it (functions included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        out.update(n for n in names if n in MODULES)
    return out


def floor(module: str) -> int:
    for level, prefixes in enumerate(FLOORS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return level
    raise AssertionError(f"{module} is on no floor: add it to FLOORS")


def test_every_module_is_on_a_floor() -> None:
    for module in MODULES:
        if module != "ackline":
            floor(module)


def test_the_package_root_imports_nothing_of_its_own() -> None:
    assert _imports("ackline", MODULES["ackline"]) == set()


def test_imports_only_go_down() -> None:
    upward = sorted(
        f"{module} (floor {floor(module)}) imports {target} (floor {floor(target)})"
        for module, path in MODULES.items()
        if module != "ackline"
        for target in _imports(module, path)
        if target != "ackline" and floor(target) > floor(module)
    )
    assert upward == []


DRIVERS = ("asyncpg", "confluent_kafka", "faust", "aiokafka")
"""Clients of PostgreSQL and Kafka: the floors below ``ackline.sinks`` know neither."""


def _third_party(path: Path) -> set[str]:
    """The top-level names of every absolute import in ``path`` (functions included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out


def test_the_schema_and_the_ground_floor_know_no_database_or_broker_client() -> None:
    """docs/design.md: schemas know nothing of Kafka or PostgreSQL. The decoder once took
    asyncpg's UUID type for its rows (0.4 us per event), which made the producer SDK load
    the database driver and hand users asyncpg's type."""
    low = [m for m in MODULES if m != "ackline" and floor(m) < floor("ackline.sinks")]
    assert "ackline.schemas.decode_fast" in low
    found = sorted(
        f"{m} imports {name}" for m in low for name in _third_party(MODULES[m]) if name in DRIVERS
    )
    assert found == []


def test_a_worker_never_loads_the_dev_stack() -> None:
    seen: set[str] = set()
    todo = [m for m in MODULES if m.startswith(PRODUCTION)]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(_imports(module, MODULES[module]))
    assert not [m for m in seen if m.startswith("ackline.dev")]
    assert len(seen) > 20  # not vacuous: the runtimes and what they stand on were walked


def test_one_import_root_is_installed() -> None:
    import tomllib

    from setuptools import find_packages

    repo = ROOT.parent
    config = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(where=str(repo), include=include)
    assert "ackline.streams.faust_runtime" in packages  # linked folders are found
    assert {p.split(".")[0] for p in packages} == {"ackline"}


def test_outside_the_repository_only_the_one_root_exists(tmp_path: Path) -> None:
    """From another directory (as an installed worker runs) the top-level folders are not
    importable on their own, and what the package reads by name (the migrations) loads.
    A test run from the repository root hides a stray `resources.files("schemas")`:
    the repository root is on sys.path there."""
    import subprocess
    import sys

    code = (
        "import importlib.util as u\n"
        "assert all(u.find_spec(n) is None for n in ('schemas', 'sinks', 'streams', 'load'))\n"
        "from ackline.sinks.admin.migrate import load_migrations\n"
        "print(len(load_migrations()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 3
