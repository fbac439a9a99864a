"""A local stand-in for the part of the Hugging Face Hub API that huggingface_hub uses.

Served on 127.0.0.1 from a thread of the test process, started and stopped by
the test:

- ``GET /api/models/{repo}[/revision/{rev}]`` (model_info, ``?blobs=true``):
  ``sha`` is the commit the revision names; ``siblings`` lists every file
  with its size and, for GGUF files, ``lfs.sha256`` and ``lfs.size``;
- ``HEAD /{repo}/resolve/{rev}/{file}`` (get_hf_file_metadata): ``X-Repo-Commit``,
  ``ETag`` and ``X-Linked-Etag`` (the sha256), ``X-Linked-Size``;
- ``GET`` of the same path, with ``Range: bytes=N-`` answered 206.

Errors carry ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound)
as the hub's do. Faults a test can ask for: drop the connection halfway
through a file once, or serve other bytes than the published sha256. Every
request is recorded (method, path, Range, Authorization) for the test to check.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    commit: str
    revisions: set[str]
    files: dict[str, bytes]  # name -> bytes (GGUF files are "LFS")


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class FakeHub:
    token: str | None = None  # when set, every request must carry it
    repos: dict[str, Repo] = field(default_factory=dict)
    drop_once: set[str] = field(default_factory=set)  # file names: cut the next GET halfway
    corrupt: set[str] = field(default_factory=set)  # file names: serve other bytes
    seen: list[Seen] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    def add_repo(self, repo: str, files: dict[str, Path | bytes], revision: str = "main") -> str:
        """Publish ``files`` as ``repo`` at ``revision``; returns the commit."""
        data = {n: (f if isinstance(f, bytes) else f.read_bytes()) for n, f in files.items()}
        h = hashlib.sha1(repo.encode())
        for name in sorted(data):
            h.update(name.encode() + hashlib.sha256(data[name]).digest())
        commit = h.hexdigest()
        self.repos[repo] = Repo(commit, {revision, commit}, data)
        return commit

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def gets(self, name: str) -> list[Seen]:
        return [s for s in self.seen if s.method == "GET" and s.path.endswith("/" + name)]


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _error(self, status: int, code: str) -> None:
            body = json.dumps({"error": code}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _authorised(self) -> bool:
            auth = self.headers.get("Authorization")
            hub.seen.append(Seen(self.command, self.path, self.headers.get("Range"), auth))
            if hub.token is not None and auth != f"Bearer {hub.token}":
                self._error(401, "RepoNotFound")
                return False
            return True

        def _repo(self, parts: list[str]) -> tuple[str, Repo | None]:
            name = "/".join(parts[:2])
            return name, hub.repos.get(name)

        def do_GET(self) -> None:
            if not self._authorised():
                return
            parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
            if parts[:2] == ["api", "models"]:
                self._model_info(parts[2:])
            else:
                self._resolve(parts, body=True)

        def do_HEAD(self) -> None:
            if not self._authorised():
                return
            parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
            self._resolve(parts, body=False)

        def _model_info(self, parts: list[str]) -> None:
            name, repo = self._repo(parts)
            if repo is None:
                return self._error(404, "RepoNotFound")
            revision = parts[3] if len(parts) >= 4 and parts[2] == "revision" else "main"
            if revision not in repo.revisions:
                return self._error(404, "RevisionNotFound")
            siblings = []
            for fname, data in sorted(repo.files.items()):
                sib: dict[str, Any] = {
                    "rfilename": fname,
                    "size": len(data),
                    "blobId": hashlib.sha1(data).hexdigest(),
                }
                if fname.endswith(".gguf"):
                    sib["lfs"] = {
                        "size": len(data),
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "pointerSize": 134,
                    }
                siblings.append(sib)
            body = json.dumps({"id": name, "sha": repo.commit, "siblings": siblings}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _resolve(self, parts: list[str], body: bool) -> None:
            # {org}/{name}/resolve/{rev}/{file...}
            _, repo = self._repo(parts)
            if repo is None or len(parts) < 5 or parts[2] != "resolve":
                return self._error(404, "RepoNotFound")
            if parts[3] not in repo.revisions:
                return self._error(404, "RevisionNotFound")
            fname = "/".join(parts[4:])
            data = repo.files.get(fname)
            if data is None:
                return self._error(404, "EntryNotFound")
            sha256 = hashlib.sha256(data).hexdigest()
            if fname in hub.corrupt:
                data = bytes(b ^ 0x5A for b in data)  # same length, other bytes
            start = 0
            wanted = self.headers.get("Range")
            if wanted and wanted.startswith("bytes="):
                start = int(wanted[len("bytes=") :].split("-")[0])
            if start >= len(data) and data:
                return self._error(416, "RangeNotSatisfiable")
            chunk = data[start:]
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("ETag", f'"{sha256}"')
            self.send_header("X-Linked-Etag", f'"{sha256}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(chunk)))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if not body:
                return
            if fname in hub.drop_once:
                hub.drop_once.discard(fname)
                self.wfile.write(chunk[: len(chunk) // 2])
                self.wfile.flush()
                self.close_connection = True  # the rest never comes
                return
            self.wfile.write(chunk)

    return Handler
