"""Writes to a connection batched per turn of the event loop: the gateway's
answers to its clients, and its requests to busy engines
(letsinfer.gateway.engine_client, whose writes leave at once unless held).

uvicorn writes a response's status line and headers, each body part and the
closing chunk with one ``transport.write`` each, and on loopback or a fast
LAN each of those is a system call in which the kernel also does much of the
receiver's work. A profile of the gateway under load showed those writes as
its largest single cost. :class:`BatchedTransport` keeps what is written
during one turn of the loop and sends it as one write at the start of the
next: the same bytes in the same order, in fewer system calls (a whole
answer that is ready at once goes out in one). When it is the only request
being answered, a complete answer leaves as soon as its last part is
written.

Closing sends what is kept first; aborting drops it, as aborting a transport
drops its buffer.
"""

from __future__ import annotations

import asyncio
from typing import Any


class BatchedTransport:
    """Wraps a transport; everything but ``write``, ``close`` and ``abort``
    passes straight through."""

    __slots__ = ("_loop", "_parts", "transport")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self._loop = loop
        self._parts: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        parts = self._parts
        parts.append(bytes(data) if not isinstance(data, bytes) else data)
        if len(parts) == 1:
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        parts = self._parts
        if not parts:
            return
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()
        if not self.transport.is_closing():
            self.transport.write(data)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def abort(self) -> None:
        self._parts.clear()
        self.transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self.transport.write_eof()

    def get_write_buffer_size(self) -> int:
        return int(self.transport.get_write_buffer_size()) + sum(len(p) for p in self._parts)

    # Called on every request by uvicorn: explicit, not through __getattr__.
    def is_closing(self) -> bool:
        return bool(self.transport.is_closing())

    def pause_reading(self) -> None:
        self.transport.pause_reading()

    def resume_reading(self) -> None:
        self.transport.resume_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class BatchedWrites:
    """Mixed in front of a uvicorn HTTP protocol class: its connection's writes
    go through a :class:`BatchedTransport`."""

    transport: Any
    tasks: set[Any]  # uvicorn's: the server's requests being answered, all connections

    def connection_made(self, transport: Any) -> None:
        batched = BatchedTransport(transport, asyncio.get_running_loop())
        super().connection_made(batched)  # type: ignore[misc]

    def on_response_complete(self, *args: Any) -> None:
        # The only request being answered: its answer leaves now, not after the
        # handler's bookkeeping (record, access log, metrics) later in this
        # turn. With others in progress it waits for the turn's end, with
        # theirs: fewer wake-ups of the clients, more answers per second.
        if len(getattr(self, "tasks", ())) <= 1:
            self.transport.flush()
        super().on_response_complete(*args)  # type: ignore[misc]
