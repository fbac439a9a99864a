"""An agent reads an engine's load in the engine's own words: free slots from
llama.cpp's /slots, waiting requests from its /metrics (a real engine here)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from letsinfer.agent.engine_load import EngineLoad, read_load
from letsinfer.engines.launch import ENGINE_KEY_ENV
from tests.nodes import free_port

KEY = "engine-key-for-this-test"


@contextlib.contextmanager
def running_engine(model: Path, key: str, parallel: int, n_ctx: int) -> Iterator[str]:
    """The bundled llama.cpp server, started as the agent starts it; its URL."""
    port = free_port()
    spec = {
        "model": str(model),
        "alias": "tiny",
        "host": "127.0.0.1",
        "port": port,
        "threads": 1,
        "n_ctx": n_ctx,
        "parallel": parallel,
        "embedding": False,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "letsinfer.engines.llamacpp_launcher", json.dumps(spec)],
        env={**os.environ, ENGINE_KEY_ENV: key},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "engine did not start"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def engine(tiny_gguf: Path) -> Iterator[str]:
    """The bundled llama.cpp server, started as the agent starts it: 2 slots."""
    with running_engine(tiny_gguf, KEY, parallel=2, n_ctx=2 * 8192) as url:
        yield url


def load_of(url: str, key: str = KEY) -> EngineLoad:
    async def read() -> EngineLoad:
        async with httpx.AsyncClient(timeout=5) as client:
            return await read_load(client, url, key)

    return asyncio.run(read())


def test_free_slots_and_queue_depth_are_the_engines_own(engine: str) -> None:
    assert load_of(engine) == EngineLoad(slots_free=2, queue_depth=0)

    # Three long generations on two slots: both busy, one waiting. Streamed, so
    # that closing them stops the engine's work (it sees the client go).
    body = {
        "model": "tiny",
        "stream": True,
        "max_tokens": 20000,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    done = threading.Event()

    def generate() -> None:
        with httpx.stream(
            "POST",
            engine + "/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {KEY}"},
            timeout=120,
        ) as response:
            for _ in response.iter_bytes():
                if done.is_set():
                    return

    clients = [threading.Thread(target=generate) for _ in range(3)]
    for t in clients:
        t.start()
    seen = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(t.is_alive() for t in clients):
        seen.append(load_of(engine))
        if seen[-1] == EngineLoad(slots_free=0, queue_depth=1):
            break
    done.set()
    for t in clients:
        t.join()
    assert EngineLoad(slots_free=0, queue_depth=1) in seen, seen
    deadline = time.monotonic() + 30
    while load_of(engine) != EngineLoad(slots_free=2, queue_depth=0):
        assert time.monotonic() < deadline, load_of(engine)
        time.sleep(0.1)


def test_without_the_engine_key_nothing_is_guessed(engine: str) -> None:
    assert load_of(engine, key="wrong") == EngineLoad(None, None)
    assert load_of(f"http://127.0.0.1:{free_port()}") == EngineLoad(None, None)
