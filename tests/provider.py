"""An external OpenAI-compatible provider for tests, on 127.0.0.1 (HTTP or HTTPS).

It answers chat completions (plain and streamed, with usage) only when the
request carries its API key and names its own model name, as a real provider
would; anything else gets the provider's 401 or 404. It keeps every request's
headers and body so a test can see exactly what the gateway sent. Setting
``outage`` to a status and headers makes it answer every request with them, as
a provider that is rate limiting or failing does; ``cut``, a stream that ends
cleanly but early.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

ANSWER = "Hello from the provider."


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Tls:
    ca: Path  # what a client trusts
    cert: Path
    key: Path


def make_tls(where: Path, name: str = "provider") -> Tls:
    """A CA of its own and a certificate for 127.0.0.1 that it signed."""
    where.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    tls = Tls(where / f"{name}-ca.pem", where / f"{name}.pem", where / f"{name}.key")
    tls.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    tls.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tls.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return tls


@dataclass
class Provider:
    key: str
    model: str
    tls: Tls | None = None
    seen: list[Seen] = field(default_factory=list)
    outage: tuple[int, dict[str, str]] | None = None
    usage: bool = True  # whether whole answers say what they used (not all providers do)
    # Streams end cleanly after two words, with no usage and no [DONE] (the
    # second word says "[DONE]", as a model's text may).
    cut: bool = False
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> Provider:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                provider.seen.append(
                    Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
                if provider.outage is not None:
                    status, headers = provider.outage
                    self._json(status, _error("The provider is failing.", "outage"), headers)
                elif self.headers.get("authorization") != f"Bearer {provider.key}":
                    self._json(401, _error("Incorrect API key provided.", "invalid_api_key"))
                elif self.path != "/v1/chat/completions":
                    self._json(404, _error("no such route", "not_found"))
                elif body.get("model") != provider.model:
                    self._json(404, _error("The model does not exist.", "model_not_found"))
                elif body.get("stream"):
                    self._stream(body)
                else:
                    answer = _completion(provider.model)
                    if not provider.usage:
                        del answer["usage"]
                    self._json(200, answer)

            def _json(
                self, status: int, obj: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, body: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                words = ["Hello", "[DONE]"] if provider.cut else ANSWER.split(" ")
                events = [_chunk(provider.model, word) for word in words]
                if (body.get("stream_options") or {}).get("include_usage"):
                    events.append({**_completion(provider.model), "choices": []})
                sent = [*(json.dumps(e) for e in events), "[DONE]"]
                for event in sent[:2] if provider.cut else sent:
                    data = f"data: {event}\n\n".encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        if self.tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self.tls.cert, self.tls.key)
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()


def _error(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}


def _completion(model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-provider",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": ANSWER},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }


def _chunk(model: str, word: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-provider",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": {"content": word + " "}, "finish_reason": None}],
    }
