#!/usr/bin/env python3
"""A LAN client for verify.yml, standard library only; prints a JSON verdict.

    lan_client.py chat URL KEY_FILE MODEL   -> {"status": 200, "content": "..."}
    lan_client.py probe HOST:PORT ...       -> {"HOST:PORT": true|false, ...}

``probe`` tries a TCP connection to each target at once (2 s each): true when
it was accepted.
"""

from __future__ import annotations

import json
import socket
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def chat(url: str, key_file: str, model: str) -> dict[str, object]:
    with open(key_file) as fh:
        key = fh.read().strip()
    body = {"model": model, "messages": [{"role": "user", "content": "Hello?"}]}
    request = urllib.request.Request(
        url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            data = json.loads(response.read())
            return {"status": response.status, "content": data["choices"][0]["message"]["content"]}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "content": exc.read().decode(errors="replace")}


def reachable(target: str) -> bool:
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def main(argv: list[str]) -> int:
    if argv[:1] == ["chat"] and len(argv) == 4:
        print(json.dumps(chat(*argv[1:])))
        return 0
    if argv[:1] == ["probe"] and len(argv) > 1:
        with ThreadPoolExecutor(len(argv) - 1) as pool:
            results = dict(zip(argv[1:], pool.map(reachable, argv[1:]), strict=True))
        print(json.dumps(results))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
