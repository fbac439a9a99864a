"""A client connection's writes, batched per turn of the event loop
(letsinfer.batched_writes): the same bytes in the same order, fewer writes;
closing sends what is kept, aborting drops it. Over real loopback sockets."""

from __future__ import annotations

import asyncio
from typing import Any

from letsinfer.batched_writes import BatchedTransport, BatchedWrites


class _Counting:
    """The real transport, with its writes counted."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


async def _pair() -> tuple[_Counting, asyncio.StreamReader, asyncio.AbstractServer]:
    accepted: asyncio.Future[asyncio.StreamReader] = asyncio.get_running_loop().create_future()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result(reader)

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport, _ = await asyncio.get_running_loop().create_connection(
        asyncio.Protocol, "127.0.0.1", port
    )
    return _Counting(transport), await accepted, server


def test_writes_in_one_turn_go_out_as_one_write_in_order() -> None:
    async def scenario() -> None:
        real, reader, server = await _pair()
        batched = BatchedTransport(real, asyncio.get_running_loop())
        batched.write(b"HTTP/1.1 200 OK\r\n\r\n")
        batched.write(b"")  # nothing: no write
        batched.write(bytearray(b"body-1;"))
        batched.write(memoryview(b"body-2"))
        assert real.writes == []  # kept until the turn ends
        await asyncio.sleep(0)
        assert real.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody-1;body-2"]
        batched.write(b"|next turn")
        await asyncio.sleep(0)
        assert len(real.writes) == 2
        batched.close()  # nothing kept: closes
        got = await reader.read()
        assert got == b"HTTP/1.1 200 OK\r\n\r\nbody-1;body-2|next turn"
        server.close()

    asyncio.run(scenario())


def test_close_sends_what_is_kept_and_abort_drops_it() -> None:
    async def scenario() -> None:
        real, reader, server = await _pair()
        batched = BatchedTransport(real, asyncio.get_running_loop())
        batched.write(b"last words")
        batched.close()  # before the turn ends: still sent, then closed
        assert await reader.read() == b"last words"
        assert batched.is_closing()

        real, reader, server2 = await _pair()
        batched = BatchedTransport(real, asyncio.get_running_loop())
        batched.write(b"never sent")
        batched.abort()
        await asyncio.sleep(0)
        assert real.writes == []
        assert await reader.read() == b""
        server.close()
        server2.close()

    asyncio.run(scenario())


def test_a_complete_answer_leaves_at_once_when_it_is_the_only_one() -> None:
    """uvicorn says when a response is complete. Alone, what is kept goes out
    then, before the handler's bookkeeping later in the turn; with other
    requests in progress it waits for the turn's end, with theirs."""

    class Protocol(asyncio.Protocol):
        completed = 0

        def __init__(self, tasks: set[str]) -> None:
            self.tasks = tasks  # as uvicorn's protocols hold the server's

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def on_response_complete(self) -> None:
            self.completed += 1

    class Batched(BatchedWrites, Protocol):
        pass

    answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"

    async def scenario() -> None:
        real, reader, server = await _pair()
        alone = Batched({"this request"})
        alone.connection_made(real)
        alone.transport.write(answer[:-2])
        alone.transport.write(b"ok")
        assert real.writes == []
        alone.on_response_complete()
        assert real.writes == [answer] and alone.completed == 1

        busy = Batched({"this request", "another"})
        busy.connection_made(real)
        busy.transport.write(answer)
        busy.on_response_complete()
        assert real.writes == [answer] and busy.completed == 1  # kept until the turn ends
        await asyncio.sleep(0)
        assert real.writes == [answer, answer]
        busy.transport.close()
        assert await reader.read() == answer + answer
        server.close()

    asyncio.run(scenario())
