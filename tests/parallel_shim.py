"""A CPU stand-in for a parallel runtime (the parallel-command protocol of
letsinfer/engines/parallel_command.py), for multi-node tests.

Task 0 (the head) waits until every other task accepts it with the group's key
(``GET /join``), then serves the OpenAI API with the bundled llama.cpp server.
Other tasks are workers: a small HTTP server whose ``/join`` checks the group
key and whose ``/health`` is 200 once the worker is ready.

Test hooks (environment): ``PARALLEL_SHIM_HOLD`` a file whose existence keeps
a worker's ``/health`` at 503 (not ready) while it still accepts its head;
``PARALLEL_SHIM_PIDS`` a directory where each task writes ``task-<id>.pid``;
``PARALLEL_SHIM_RECORD`` a directory where each task writes what it was given.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import sys
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from letsinfer.engines import llamacpp_launcher
from letsinfer.engines.parallel_command import GROUP_KEY_ENV, TASKS_ENV


def _note(args: argparse.Namespace, group_key: str) -> None:
    pids = os.environ.get("PARALLEL_SHIM_PIDS")
    if pids:
        Path(pids).mkdir(parents=True, exist_ok=True)
        (Path(pids) / f"task-{args.task}.pid").write_text(str(os.getpid()))
    record = os.environ.get("PARALLEL_SHIM_RECORD")
    if record:
        Path(record).mkdir(parents=True, exist_ok=True)
        (Path(record) / f"task-{args.task}.json").write_text(
            json.dumps(
                {
                    "argv": sys.argv[1:],
                    "tasks": json.loads(os.environ[TASKS_ENV]),
                    "has_group_key": bool(group_key),
                    "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                }
            )
        )


def worker(args: argparse.Namespace, group_key: str) -> int:
    hold = os.environ.get("PARALLEL_SHIM_HOLD")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                ready = not (hold and Path(hold).exists())
                self._reply(200 if ready else 503, b"ok" if ready else b"held")
            elif self.path == "/join":
                given = self.headers.get("Authorization", "")
                ok = hmac.compare_digest(given, f"Bearer {group_key}")
                self._reply(200 if ok else 403, b"joined" if ok else b"wrong group key")
            else:
                self._reply(404, b"")

        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    server = ThreadingHTTPServer((args.host, int(args.port)), Handler)
    server.serve_forever()
    return 0


def head(args: argparse.Namespace, group_key: str) -> int:
    tasks = json.loads(os.environ[TASKS_ENV])
    for t in tasks:
        if t["task"] == "0":
            continue
        url = f"http://{t['address']}:{t['port']}/join"
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {group_key}"})
        while True:
            try:
                with urllib.request.urlopen(req, timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        print(f"parallel-shim: task {t['task']} joined", flush=True)
    spec = {
        "model": args.model,
        "alias": args.alias,
        "host": args.host,
        "port": int(args.port),
        "threads": int(args.threads),
        "n_ctx": int(args.ctx_size),
        "parallel": int(args.parallel),
        "embedding": False,
    }
    return llamacpp_launcher.main(["shim", json.dumps(spec)])


def main() -> int:
    ap = argparse.ArgumentParser()
    for flag in (
        "--task",
        "--model",
        "--alias",
        "--host",
        "--port",
        "--threads",
        "--ctx-size",
        "--parallel",
    ):
        ap.add_argument(flag, required=True)
    args = ap.parse_args()
    group_key = os.environ.pop(GROUP_KEY_ENV, "")
    if not group_key:
        print("parallel-shim: no group key in the environment", file=sys.stderr)
        return 2
    _note(args, group_key)
    return head(args, group_key) if args.task == "0" else worker(args, group_key)


if __name__ == "__main__":
    sys.exit(main())
