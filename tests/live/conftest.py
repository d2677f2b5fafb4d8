"""Fixtures: fake OpenAI-compatible servers on loopback, started and stopped per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.live.fake_server import FakeConfig, FakeServer


@pytest.fixture
def fake_server() -> Iterator[Callable[..., FakeServer]]:
    """`fake_server(recall_last=3000, ...)` starts a server; all are stopped after the test.
    `fake_server(port=old.port, ...)` relaunches one at a stopped server's URL (a new launch)."""
    started: list[FakeServer] = []

    def start(port: int = 0, **kwargs: object) -> FakeServer:
        server = FakeServer(FakeConfig(**kwargs), port=port).start()  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
