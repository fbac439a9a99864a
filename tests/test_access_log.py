"""The inference access-log line: what a handler receives is what
``logger.info`` would have given it, however the record was made."""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator

import pytest

from letsinfer.gateway import access_log

ARGS = ("req-1", "alice", "mock", "mock", "pg-a", 200, 0.5, "1.25", 3.0, 12, 16, "")


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[Kept]:
    handler = Kept()
    logger = access_log.logger
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_line_is_the_record_logger_info_makes(kept: Kept) -> None:
    access_log.logger.info(access_log._LINE, *ARGS)
    access_log.write_many([ARGS])
    access_log.write_many([ARGS])
    by_info, *written = kept.records
    assert written[0] is not written[1]  # a record of its own each time
    for record in written:
        assert record.getMessage() == by_info.getMessage()
        assert record.getMessage().startswith("request_id=req-1 key=alice model=mock")
        ours, theirs = dict(record.__dict__), dict(by_info.__dict__)
        # Where the call came from and when: the only fields that may differ.
        for field in ("created", "msecs", "relativeCreated", "pathname", "filename"):
            ours.pop(field), theirs.pop(field)
        for field in ("module", "lineno", "funcName"):
            ours.pop(field), theirs.pop(field)
        assert ours == theirs
        assert by_info.created <= record.created
        assert 0 <= record.msecs < 1000


def test_each_thread_gets_its_own_thread_fields(kept: Kept) -> None:
    access_log.write_many([ARGS])
    # One thread after another: a new thread often gets an ended one's ident.
    for name in ("first-writer", "second-writer"):
        other = threading.Thread(target=access_log.write_many, args=([ARGS],), name=name)
        other.start()
        other.join()
    names = [(r.threadName, r.thread) for r in kept.records]
    assert [n for n, _ in names] == [
        threading.current_thread().name,
        "first-writer",
        "second-writer",
    ]
    assert names[0][1] == threading.get_ident()


def test_a_record_factory_set_by_someone_else_is_used(kept: Kept) -> None:
    default = logging.getLogRecordFactory()

    def tagged(*args: object, **kwargs: object) -> logging.LogRecord:
        record = default(*args, **kwargs)  # type: ignore[arg-type]
        record.tag = "theirs"
        return record

    logging.setLogRecordFactory(tagged)
    try:
        access_log.write_many([ARGS, ARGS])
    finally:
        logging.setLogRecordFactory(default)
    assert [r.tag for r in kept.records] == ["theirs", "theirs"]  # type: ignore[attr-defined]


def test_nothing_is_made_when_the_level_is_off(kept: Kept) -> None:
    access_log.logger.setLevel(logging.WARNING)
    made = []

    def lines() -> Iterator[tuple[object, ...]]:
        made.append(ARGS)  # a line's arguments are not even built
        yield ARGS

    access_log.write_many(lines())
    assert kept.records == [] and made == []


class CountedStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_lines_written_together_read_as_lines_written_one_by_one() -> None:
    logger = access_log.logger
    one_by_one, together = CountedStream(), CountedStream()
    lines = [(f"req-{n}", *ARGS[1:]) for n in range(5)]
    fmt = logging.Formatter("%(levelname)s %(name)s %(threadName)s: %(message)s")
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        for stream, write in ((one_by_one, "each"), (together, "many")):
            handler = logging.StreamHandler(stream)
            handler.setFormatter(fmt)
            handler.addFilter(lambda r: r.args[0] != "req-3")  # a handler's filter still applies
            logger.addHandler(handler)
            try:
                if write == "each":
                    for args in lines:
                        access_log.write_many([args])
                else:
                    access_log.write_many(iter(lines))
            finally:
                logger.removeHandler(handler)
    finally:
        logger.setLevel(level)
        logger.propagate = propagate
    assert together.getvalue() == one_by_one.getvalue()
    assert together.getvalue().count("\n") == 4 and "req-3" not in together.getvalue()
    assert (one_by_one.writes, together.writes) == (4, 1)


def test_lines_for_any_other_handler_go_one_by_one(kept: Kept) -> None:
    second = ("req-2", *ARGS[1:])
    access_log.write_many([ARGS, second])
    assert [r.getMessage() for r in kept.records] == [
        access_log._LINE % ARGS,
        access_log._LINE % second,
    ]
