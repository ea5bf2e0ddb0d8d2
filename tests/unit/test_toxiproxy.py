"""The pure parts of ackline.dev.toxiproxy: where it is built, how, and the toxic bodies."""

from __future__ import annotations

from pathlib import Path

import pytest

from ackline.dev import toxiproxy
from ackline.dev.toxiproxy import (
    Toxic,
    ToxiproxyError,
    build_command,
    build_env,
    expand,
    present_names,
    split_listen,
    toxic_body,
)


def test_cache_dir_follows_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert toxiproxy.cache_dir() == tmp_path / "ackline" / "toxiproxy-2.5.0"
    assert toxiproxy.binary_path() == tmp_path / "ackline" / "toxiproxy-2.5.0" / "bin" / "server"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert toxiproxy.cache_dir() == Path.home() / ".cache" / "ackline" / "toxiproxy-2.5.0"


def test_the_build_is_a_pinned_go_install_with_every_go_path_in_the_cache() -> None:
    assert build_command() == [
        "go",
        "install",
        "github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0",
    ]
    root = Path("/cache/toxiproxy-2.5.0")
    env = build_env(root, {"PATH": "/usr/bin", "GOPATH": "/home/u/go"})
    assert env["PATH"] == "/usr/bin"
    for name in ("GOPATH", "GOBIN", "GOCACHE", "GOMODCACHE"):
        assert Path(env[name]).is_relative_to(root), name
    assert env["GOFLAGS"] == "-modcacherw" and env["GOTOOLCHAIN"] == "local"


def test_both_directions_are_two_toxics() -> None:
    assert expand("bh", "both") == [("upstream", "bh_up"), ("downstream", "bh_down")]
    assert expand("slow", "upstream") == [("upstream", "slow")]


def test_a_name_stands_for_itself_or_its_two_halves() -> None:
    assert present_names("slow", {"slow", "other"}) == ["slow"]
    assert present_names("bh", {"bh_up", "bh_down"}) == ["bh_up", "bh_down"]
    with pytest.raises(ToxiproxyError, match="no toxic 'gone'"):
        present_names("gone", {"bh_up"})


def test_toxic_body_and_round_trip() -> None:
    body = toxic_body("lat", "latency", "downstream", {"latency": 1, "jitter": 0}, 1.0)
    assert body == {
        "name": "lat",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
        "attributes": {"latency": 1, "jitter": 0},
    }
    assert Toxic.from_json(body) == Toxic("lat", "latency", "downstream", 1.0, body["attributes"])
    with pytest.raises(ToxiproxyError, match="toxicity"):
        toxic_body("x", "latency", "upstream", {}, 1.5)


def test_split_listen() -> None:
    assert split_listen("127.0.0.1:8474") == ("127.0.0.1", 8474)
    with pytest.raises(ToxiproxyError):
        split_listen("127.0.0.1")
