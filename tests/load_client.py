"""A small load client, run inside a namespace by the cluster tests.

python tests/load_client.py URL KEY MODEL REQUESTS THREADS [PROMPT]  -> JSON list of statuses
    (PROMPT: the user message, "hi" when not given)
python tests/load_client.py stream URL KEY MODEL FLAG_FILE  -> reads a long stream,
    pausing after the first chunk until FLAG_FILE exists; prints JSON summary
python tests/load_client.py streams URL KEY MODEL STOP_FILE THREADS -> streams one
    request after another on each thread until STOP_FILE exists; prints one JSON
    summary per request (status, whether the stream ended whole, the group)
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx


def load(url: str, key: str, model: str, n: int, threads: int, prompt: str = "hi") -> None:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}]}
    headers = {"authorization": f"Bearer {key}"}
    with httpx.Client(timeout=30) as client:

        def one(_: int) -> int:
            try:
                return client.post(
                    url + "/v1/chat/completions", json=body, headers=headers
                ).status_code
            except httpx.HTTPError:
                return -1

        with ThreadPoolExecutor(threads) as pool:
            print(json.dumps(list(pool.map(one, range(n)))))


def stream(url: str, key: str, model: str, flag: str) -> None:
    # ignore_eos: the tiny model then repeats its sentence, making a long stream.
    body = {
        "model": model,
        "stream": True,
        "max_tokens": 1500,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    chunks, finish, started = 0, None, False
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        json=body,
        timeout=60,
        headers={"authorization": f"Bearer {key}"},
    ) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks += 1
            if not started:
                started = True
                print("STARTED", flush=True)
                deadline = time.monotonic() + 60
                while not Path(flag).exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
            choice = (json.loads(line[6:]).get("choices") or [{}])[0]
            finish = choice.get("finish_reason") or finish
    print(json.dumps({"status": resp.status_code, "chunks": chunks, "finish": finish}))


def streams(url: str, key: str, model: str, stop: str, threads: int) -> None:
    body = {
        "model": model,
        "stream": True,
        "max_tokens": 60,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    headers = {"authorization": f"Bearer {key}"}

    def loop(_: int) -> list[dict[str, object]]:
        done: list[dict[str, object]] = []
        with httpx.Client(timeout=60) as client:
            while not Path(stop).exists():
                chunks, whole, status = 0, False, -1
                try:
                    with client.stream(
                        "POST", url + "/v1/chat/completions", json=body, headers=headers
                    ) as resp:
                        status = resp.status_code
                        for line in resp.iter_lines():
                            if line == "data: [DONE]":
                                whole = True
                            elif line.startswith("data: "):
                                chunks += 1
                except httpx.HTTPError as exc:
                    done.append({"status": -1, "whole": False, "error": repr(exc)})
                    continue
                done.append({"status": status, "whole": whole, "chunks": chunks})
        return done

    with ThreadPoolExecutor(threads) as pool:
        print(json.dumps([r for rs in pool.map(loop, range(threads)) for r in rs]))


if __name__ == "__main__":
    if sys.argv[1] == "stream":
        stream(*sys.argv[2:6])
    elif sys.argv[1] == "streams":
        streams(*sys.argv[2:6], int(sys.argv[6]))
    else:
        load(
            sys.argv[1],
            sys.argv[2],
            sys.argv[3],
            int(sys.argv[4]),
            int(sys.argv[5]),
            *sys.argv[6:7],
        )
