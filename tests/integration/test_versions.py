"""The PostgreSQL version the deployment files name is the one the tests run against.

Every integration test runs on the local stack's PostgreSQL (Debian's package: 15 on
this machine's Debian 12); docker-compose.yml must ship that major version, not one no
test has seen (issue 18: compose had 17 while every test ran on 15).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.integration.harness import Services, db

ROOT = Path(__file__).resolve().parents[2]


def test_compose_postgres_is_the_major_version_under_test(services: Services) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    image = str(compose["services"]["postgres"]["image"])
    found = re.fullmatch(r"postgres:(\d+)\.(\d+)", image)
    assert found, image
    number = int(db(services.database_url, "SHOW server_version_num")[0]["server_version_num"])
    assert int(found[1]) == number // 10_000, f"compose {image}, tests run on {number}"
