"""The docs stay a door and a house that fit the code.

README.md is a short door (under 10 KB) that indexes every page of docs/; the settings
table of docs/operating.md is generated from the settings model and must equal it (like
the bench block of docs/performance.md, tests/unit/test_bench_readme.py); every relative
link and every repository path a page names exists; and nothing cites a document a clone
does not have.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

import ackline
from ackline.commands import config
from ackline.core.errors import AcklineError

ROOT = Path(ackline.__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
MARKDOWN = [README, *PAGES]

_LINK = re.compile(r"\]\(([^)\s]+)\)")
# A backticked repository path, e.g. `sinks/ingest/writer.py`, `tests/x.py::test_y` or
# `sinks/ingest/writer.py::BatchWriter.write` (every dotted part must be defined there).
_PATH = re.compile(
    r"`((?:ackline|schemas|sinks|streams|load|tests|deploy|docs|examples)/[^`\s:]*)(?:::([\w.]+))?`"
)
_SKIP_DIRS = {".git", ".venv", ".ackline", "node_modules", "__pycache__"}
_TEXT = {".py", ".md", ".sql", ".toml", ".yml", ".yaml", ".json", ".txt", ".cfg", ".ini"}


def _repo_files() -> list[Path]:
    """The repository's text files, without the venv, the local stack and caches."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [
            d
            for d in dirs
            if d not in _SKIP_DIRS
            and not d.endswith((".egg-info", "_cache"))
            and not os.path.islink(os.path.join(folder, d))  # ackline/sinks -> ../sinks
        ]
        for name in files:
            path = Path(folder) / name
            if path.suffix in _TEXT or name in ("Makefile", "Dockerfile"):
                found.append(path)
    return found


def test_readme_is_a_short_door() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.encode()) < 10_000, f"README.md is {len(text.encode())} bytes"
    assert "make demo" in text and "make test" in text
    first_screen = "\n".join(text.splitlines()[:12])
    assert "docs/producing.md" in first_screen


def test_readme_indexes_every_page() -> None:
    text = README.read_text(encoding="utf-8")
    missing = [p.name for p in PAGES if f"(docs/{p.name})" not in text]
    assert missing == [], f"README.md does not link these pages of docs/: {missing}"


def test_settings_table_is_the_settings_model() -> None:
    text = (DOCS / "operating.md").read_text(encoding="utf-8")
    assert config.reference_block() in text, (
        "the settings table of docs/operating.md differs from ackline.settings: "
        "run `.venv/bin/ackline config reference --into docs/operating.md`"
    )


def test_every_setting_is_described() -> None:
    assert [name for name, _, _, _, what in config.reference_rows() if not what] == []


def test_settings_splice_replaces_only_the_block() -> None:
    text = f"before\n{config.START}\nold\n{config.END}\nafter\n"
    assert config.splice(text, "NEW") == "before\nNEW\nafter\n"
    with pytest.raises(AcklineError, match="no settings block"):
        config.splice("no markers here", "NEW")


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: p.name)
def test_relative_links_point_at_files(page: Path) -> None:
    broken = []
    for target in _LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        if not (page.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    assert broken == [], f"{page.name} links to missing files: {broken}"


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: p.name)
def test_named_paths_and_tests_exist(page: Path) -> None:
    missing = []
    for path, name in _PATH.findall(page.read_text(encoding="utf-8")):
        if re.search(r"NNNN|[<*]", path):
            continue  # a pattern, not a file: schemas/sql/NNNN_name.sql
        target = ROOT / path.rstrip("/.,")
        if not target.exists():
            missing.append(path)
        elif name and target.suffix == ".py":
            tree = ast.parse(target.read_text(encoding="utf-8"))
            defined = {
                n.name
                for n in ast.walk(tree)
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            }
            if not set(name.split(".")) <= defined:
                missing.append(f"{path}::{name}")
    assert missing == [], f"{page.name} names what does not exist: {missing}"


def test_nothing_cites_a_document_a_clone_does_not_have() -> None:
    absent = ("DESIGN" + ".md", "../" + "shared")
    found = [
        f"{path.relative_to(ROOT)}: {word}"
        for path in _repo_files()
        for word in absent
        if word in path.read_text(encoding="utf-8", errors="replace")
    ]
    assert found == []


def test_code_cites_pages_not_readme_sections() -> None:
    """Code points at docs/<page>.md; README sections are gone. Applied migrations are the
    exception (checksummed, never edited): what they cite must still be in README.md."""
    cite = re.compile(r"""README[,]?\s+["']([^"']+)["']""")
    readme = README.read_text(encoding="utf-8")
    wrong = []
    for path in _repo_files():
        if path.suffix == ".md":
            continue
        rel = path.relative_to(ROOT)
        for section in cite.findall(path.read_text(encoding="utf-8", errors="replace")):
            if rel.parts[:2] == ("schemas", "sql") and section in readme:
                continue
            wrong.append(f"{rel}: README {section!r}")
    assert wrong == [], "cite docs/<page>.md instead: " + "; ".join(wrong)
