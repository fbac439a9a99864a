"""A stand-in for a CUDA ``llama-server`` binary on a host without a GPU.

It accepts the same command line the agent builds for a real ``llama-server``,
records the environment it was given (so a test can see exactly which GPUs
the engine was shown), then serves with the bundled llama.cpp server.

It fails on purpose, as a broken build would (an error line in llama.cpp's
format, exit 1), when ``LLAMA_SHIM_FAIL`` is set, or while the file named by
``LLAMA_SHIM_FAIL_WHILE`` exists; it takes ``LLAMA_SHIM_SLOW_START`` seconds to
start when that is set.

``LLAMA_SHIM_REQUEST_S`` makes it a GPU that takes time to answer: each
completion holds one of its ``--parallel`` slots for that many seconds before
the engine answers it (a front on the given port; the engine listens on a
port of its own behind it). A benchmark uses it for requests that cost GPU
time, which a load of another model on the same GPU takes away.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from letsinfer.engines import llamacpp_launcher
from letsinfer.engines.launch import ENGINE_KEY_ENV


def main() -> int:
    if sys.argv[1:] == ["--version"]:  # as llama-server prints it (on stderr)
        print("version: 0 (shim)\nbuilt with letsinfer's test shim", file=sys.stderr)
        return 0
    ap = argparse.ArgumentParser()
    for flag in (
        "--model",
        "--alias",
        "--host",
        "--port",
        "--threads",
        "--threads-batch",
        "--ctx-size",
        "--parallel",
        "--api-key-file",
        "--pooling",
        "--n-gpu-layers",
    ):
        ap.add_argument(flag)
    for flag in ("--slots", "--metrics", "--embeddings", "--lora-init-without-apply"):
        ap.add_argument(flag, action="store_true")
    ap.add_argument("--lora-scaled", action="append", default=[])
    args = ap.parse_args()
    told = os.environ.get("LLAMA_SHIM_FAIL")
    flag = os.environ.get("LLAMA_SHIM_FAIL_WHILE")
    if told or (flag and Path(flag).exists()):
        print("0.00.000.100 I srv    load_model: loading model", flush=True)
        print(
            f"0.00.000.200 E llama_model_load: error loading model: shim broken on purpose "
            f"({told or flag})",
            flush=True,
        )
        return 1
    slow = os.environ.get("LLAMA_SHIM_SLOW_START")  # a big model or a slow disk
    if slow:
        time.sleep(float(slow))
    record = os.environ.get("LLAMA_SHIM_RECORD")
    if record:
        Path(record).write_text(
            json.dumps(
                {
                    "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "n_gpu_layers": args.n_gpu_layers,
                    "argv": sys.argv[1:],
                }
            )
        )
    os.environ[ENGINE_KEY_ENV] = Path(args.api_key_file).read_text().strip()
    port = int(args.port)
    request_s = os.environ.get("LLAMA_SHIM_REQUEST_S")
    if request_s:
        port = serve_slowly(args.host, port, int(args.parallel), float(request_s))
    spec = {
        "model": args.model,
        "alias": args.alias,
        "host": args.host,
        "port": port,
        "threads": int(args.threads),
        "n_ctx": int(args.ctx_size),
        "parallel": int(args.parallel),
        "embedding": args.embeddings,
        "loras": [item.rsplit(":", 1)[0] for item in args.lora_scaled],
    }
    return llamacpp_launcher.main(["shim", json.dumps(spec)])


def serve_slowly(host: str, port: int, slots: int, seconds: float) -> int:
    """Answer on ``port`` through a front that holds each completion in one of
    ``slots`` for ``seconds``; returns the port the engine itself takes."""
    with socket.socket() as s:
        s.bind((host, 0))
        engine_port = s.getsockname()[1]
    busy = threading.BoundedSemaphore(slots)

    class Front(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.command == "POST" and self.path.endswith("completions"):
                with busy:
                    time.sleep(seconds)
                    self.relay(body)
            else:
                self.relay(body)

        def relay(self, body: bytes) -> None:
            engine = http.client.HTTPConnection(host, engine_port, timeout=600)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                engine.request(self.command, self.path, body=body, headers=headers)
                answer = engine.getresponse()
                data = answer.read()
            except OSError:  # the engine is not listening yet
                self.send_response(503)
                data, kept = b"", []
            else:
                self.send_response(answer.status)
                kept = [
                    (k, v)
                    for k, v in answer.getheaders()
                    if k.lower() not in ("content-length", "transfer-encoding", "connection")
                ]
            finally:
                engine.close()
            for k, v in kept:
                self.send_header(k, v)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = forward

    # Its threads inherit the mask, so the launcher's sigwait still sees the stop.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    front = ThreadingHTTPServer((host, port), Front)
    front.daemon_threads = True
    threading.Thread(target=front.serve_forever, daemon=True).start()
    return engine_port


if __name__ == "__main__":
    sys.exit(main())
