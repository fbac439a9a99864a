"""Per-request records: one compact row per answered request, in their own
SQLite file beside the authority (never in it), so writing them never holds
the authority's lock. Rows are written in batches by one writer thread
(letsinfer.usage.recorder) and read by the CLI; they hold no prompt or
response text and no key secret."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Literal, NamedTuple

from letsinfer.home import admin_gid, share_with_group
from letsinfer.store.bulk import insert_rows, stage_rows


class RequestRecord(NamedTuple):
    ts: float  # wall clock at arrival, seconds since the epoch
    request_id: str
    key: str  # the API key's name
    model: str
    pg: str | None  # placement group that answered
    node: str | None  # its node's id
    endpoint: str  # chat, completions or embeddings
    stream: bool
    status: int
    prompt_tokens: int | None
    completion_tokens: int | None
    ttft_ms: float | None
    duration_ms: float
    queue_ms: float
    cached: bool = False  # answered from the response cache: no tokens spent
    # The tokens its key was charged when it reported none (a stream cut before
    # its usage): an estimate, counted by limits instead of the two counts.
    charged: int | None = None
    # Its X-Letsinfer-Tags: a JSON array of distinct tags (letsinfer.gateway.tags).
    tags: str | None = None
    # How long it waited for its model to load (letsinfer.capacity); None: it
    # did not wait for a load.
    load_wait_ms: float | None = None


class UsageRow(NamedTuple):
    name: str
    requests: int
    errors: int  # status 400 and above
    prompt_tokens: int
    completion_tokens: int


UsageBy = Literal["key", "model", "node", "tag"]

# A key's tokens in its budget period, and its last minute's requests as
# (arrival, end, tokens, counted as a request): what rate limits are rebuilt from.
KeyUsage = tuple[int, list[tuple[float, float, int, bool]]]
_TOKENS = "COALESCE(charged, COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0))"
# When a request ended: the gateway charges tokens then, so a request longer
# than a minute, or across midnight, counts in the same window and period
# after a restart as before it. Its index is on this same expression: SQLite
# uses an index on an expression only for queries that repeat it.
_ENDED = "ts + duration_ms / 1000.0"
_ENDED_INDEX = f"CREATE INDEX IF NOT EXISTS requests_ended ON requests ({_ENDED})"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    ts REAL NOT NULL,
    request_id TEXT NOT NULL,
    key TEXT NOT NULL,
    model TEXT NOT NULL,
    pg TEXT,
    node TEXT,
    endpoint TEXT NOT NULL,
    stream INTEGER NOT NULL,
    status INTEGER NOT NULL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    ttft_ms REAL,
    duration_ms REAL NOT NULL,
    queue_ms REAL NOT NULL,
    cached INTEGER NOT NULL DEFAULT 0,
    charged INTEGER,
    tags TEXT,
    load_wait_ms REAL
);
CREATE INDEX IF NOT EXISTS requests_ts ON requests (ts);
CREATE INDEX IF NOT EXISTS requests_id ON requests (request_id);
"""
# What a column added since the first release reads as in a file without it.
_DEFAULTS = {"cached": "0", "charged": "NULL", "tags": "NULL", "load_wait_ms": "NULL"}
_GROUP = {"key": "key", "model": "model", "node": "COALESCE(node, '-')"}


class RequestStore:
    """One connection; the writer uses it from a single thread at a time."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        if readonly:
            self.conn = sqlite3.connect(
                f"file:{path}?mode=ro", uri=True, timeout=10.0, check_same_thread=False
            )
            # A file the gateway of an earlier release wrote (until it restarts
            # and adds them): its missing columns read as their defaults.
            have = {row[1] for row in self.conn.execute("PRAGMA table_info(requests)")}
            self._columns = ", ".join(
                c if c in have else f"{_DEFAULTS.get(c, 'NULL')} AS {c}"
                for c in RequestRecord._fields
            )
            self.dated_at_end = self._has_index("requests_ended")
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():  # like the authority: owner and the letsinfer group
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o660))
            path.chmod(0o660)
            share_with_group(path, admin_gid())  # the letsinfer group's CLI
        self.conn = sqlite3.connect(path, timeout=10.0, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, never corrupt
        self.conn.executescript(_SCHEMA)
        columns = {row[1] for row in self.conn.execute("PRAGMA table_info(requests)")}
        if "cached" not in columns:  # a file written before the response cache existed
            self.conn.execute("ALTER TABLE requests ADD COLUMN cached INTEGER NOT NULL DEFAULT 0")
        if "charged" not in columns:  # ... or before estimated charges were kept
            self.conn.execute("ALTER TABLE requests ADD COLUMN charged INTEGER")
        if "tags" not in columns:  # ... or before request tags
            self.conn.execute("ALTER TABLE requests ADD COLUMN tags TEXT")
        if "load_wait_ms" not in columns:  # ... or before loads on demand were recorded
            self.conn.execute("ALTER TABLE requests ADD COLUMN load_wait_ms REAL")
        self._columns = ", ".join(RequestRecord._fields)
        # A new file gets the end-time index now; a file an earlier release
        # filled gets it from the writer's next round (``date_at_end``), not
        # here: on a big file it takes a while, and the gateway opens this
        # file to count its keys before it serves.
        self.dated_at_end = self._has_index("requests_ended")
        empty = self.conn.execute("SELECT 1 FROM requests LIMIT 1").fetchone() is None
        if empty and not self.dated_at_end:
            self.date_at_end()

    @classmethod
    def unwritten(cls, records: list[RequestRecord]) -> RequestStore:
        """Records the file could not take (a full disk), in memory, to be read
        as the file is: they count for limits while they wait for the disk."""
        store = cls.__new__(cls)
        store.path = Path(":memory:")
        store.conn = sqlite3.connect(":memory:", check_same_thread=False)
        store.conn.executescript(_SCHEMA)
        store._columns = ", ".join(RequestRecord._fields)
        store.date_at_end()
        store.insert_many(records)
        return store

    def _has_index(self, name: str) -> bool:
        query = "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?"
        return self.conn.execute(query, (name,)).fetchone() is not None

    def date_at_end(self) -> None:
        """Index the records by end time, so limits date their tokens as the
        gateway charged them (until then, a recount dates them at arrival)."""
        with self.conn:
            self.conn.execute(_ENDED_INDEX)
        self.dated_at_end = True

    def close(self) -> None:
        self.conn.close()

    def insert_many(self, records: list[RequestRecord]) -> None:
        """A few hundred rows per statement (see letsinfer.store.bulk)."""
        with self.conn:
            insert_rows(self.conn, "requests", records, RequestRecord._fields)

    def prune(self, before: float) -> int:
        with self.conn:
            return self.conn.execute("DELETE FROM requests WHERE ts < ?", (before,)).rowcount

    def find(self, request_id: str) -> list[RequestRecord]:
        rows = self.conn.execute(
            f"SELECT {self._columns} FROM requests WHERE request_id = ? ORDER BY ts",
            (request_id,),
        ).fetchall()
        return [RequestRecord(*r[:7], bool(r[7]), *r[8:14], bool(r[14]), *r[15:]) for r in rows]

    def key_usage(
        self, period_starts: dict[str, float | None], window_from: float
    ) -> dict[str, KeyUsage]:
        """Per key: its tokens since its period's start (None: no budget), and
        its requests that ended since ``window_from``, tokens dated at their
        end as the gateway charges them. Counted as requests, as the
        gateway counts them: not one refused with 429 by the gateway (a rate
        limit or a full queue: no group), nor one refused before its key's limits saw it
        (a body that is not a valid request, an unknown model, too large:
        400, 404 or 413 with no group), nor one whose client left before any
        engine had it (499 with no group)."""
        # Without its index (a file of an earlier release, until the writer
        # builds it) end times would mean reading every row: arrival instead.
        ended = _ENDED if self.dated_at_end else "ts"
        keys = list(period_starts)
        spent: dict[str, int] = {}
        recent: dict[str, list[tuple[float, float, int, bool]]] = {key: [] for key in keys}
        with self.conn:  # (the staged keys' statements, ended at once)
            stage_rows(self.conn, "counted_keys (key TEXT PRIMARY KEY, start REAL)",
                       list(period_starts.items()))  # fmt: skip
            # One pass over the rows of each period start (keys share a few),
            # not one per key: each pass reads every key's rows in its range.
            for start in {s for s in period_starts.values() if s is not None}:
                spent.update(
                    self.conn.execute(
                        f"SELECT key, COALESCE(SUM({_TOKENS}), 0) FROM requests "
                        f"WHERE {ended} >= ? AND cached = 0 AND key IN "
                        "(SELECT key FROM temp.counted_keys WHERE start = ?) GROUP BY key",
                        (start, start),
                    )
                )
            # Unordered (the limiter sorts them): ORDER BY ts would have SQLite
            # walk the whole ts index rather than the minute's end times.
            for key, ts, end, tokens, cached, counted in self.conn.execute(
                f"SELECT key, ts, {ended}, {_TOKENS}, cached, "
                "NOT (pg IS NULL AND status IN (400, 404, 413, 429, 499)) "
                f"FROM requests WHERE {ended} >= ? AND key IN (SELECT key FROM temp.counted_keys)",
                (window_from,),
            ):
                recent[key].append((ts, end, 0 if cached else tokens, counted == 1))
        return {key: (int(spent.get(key, 0)), recent[key]) for key in keys}

    def daily_usage(self, keys: list[str], since: float) -> list[tuple[str, str, int, int, int]]:
        """The portal's "my usage": per UTC day and model, over ``keys``:
        (day, model, requests, prompt tokens, completion tokens)."""
        if not keys:
            return []
        marks = ", ".join("?" for _ in keys)
        rows = self.conn.execute(
            "SELECT date(ts, 'unixepoch') AS day, model, COUNT(*), "
            "COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0) "
            f"FROM requests WHERE ts >= ? AND key IN ({marks}) "
            "GROUP BY day, model ORDER BY day DESC, model",
            (since, *keys),
        ).fetchall()
        return [tuple(r) for r in rows]

    def usage_by_project(
        self, keys: list[tuple[str, float, float | None, str | None]], since: float | None = None
    ) -> list[UsageRow]:
        """Sums per project. ``keys``: every API key the authority has had, as
        (name, created, revoked or None, project or None). A record counts
        under the project of the key that bore its name when it arrived (a
        revoked key's name may be taken again, by a key of another project);
        one of a key without a project, or of none known, under ``-``."""
        with self.conn:  # (the staged keys' statements, ended at once)
            stage_rows(self.conn, "key_projects (key TEXT, born REAL, gone REAL, project TEXT)",
                       keys)  # fmt: skip
            rows = self.conn.execute(
                "SELECT COALESCE(p.project, '-') AS name, COUNT(*), SUM(r.status >= 400), "
                "COALESCE(SUM(r.prompt_tokens), 0), COALESCE(SUM(r.completion_tokens), 0) "
                "FROM requests r LEFT JOIN temp.key_projects p ON p.key = r.key "
                "AND r.ts >= p.born AND (p.gone IS NULL OR r.ts < p.gone) "
                "WHERE r.ts >= ? GROUP BY name ORDER BY name",
                (since or 0.0,),
            ).fetchall()
        return [UsageRow(*r) for r in rows]

    def group_counts(self, model: str, since: float) -> dict[str | None, tuple[int, int]]:
        """Per placement group that answered ``model`` since ``since``: its
        requests and errors (status 400 and above)."""
        rows = self.conn.execute(
            "SELECT pg, COUNT(*), SUM(status >= 400) FROM requests "
            "WHERE ts >= ? AND model = ? GROUP BY pg",
            (since, model),
        ).fetchall()
        return {pg: (n, errors or 0) for pg, n, errors in rows}

    def group_durations(
        self, model: str, since: float, groups: list[str], limit: int = 20_000
    ) -> list[float]:
        """How long the latest (at most ``limit``) answers of ``model`` by these
        groups since ``since`` took, in milliseconds (for percentiles)."""
        if not groups:
            return []
        marks = ", ".join("?" * len(groups))
        rows = self.conn.execute(
            f"SELECT duration_ms FROM requests WHERE ts >= ? AND model = ? AND pg IN ({marks}) "
            "ORDER BY ts DESC LIMIT ?",
            (since, model, *groups, limit),
        ).fetchall()
        return [r[0] for r in rows]

    def usage(self, by: UsageBy, since: float | None = None) -> list[UsageRow]:
        """Sums per ``by``; by tag, a request counts under each of its tags
        (so the rows can sum to more than the requests), and untagged ones
        under none."""
        if by == "tag":
            have = {row[1] for row in self.conn.execute("PRAGMA table_info(requests)")}
            if "tags" not in have:  # a file no gateway with tags wrote yet
                return []
            rows = self.conn.execute(
                "SELECT tag.value AS name, COUNT(*), SUM(status >= 400), "
                "COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0) "
                "FROM requests, json_each(requests.tags) AS tag "
                "WHERE ts >= ? AND requests.tags IS NOT NULL GROUP BY tag.value ORDER BY name",
                (since or 0.0,),
            ).fetchall()
            return [UsageRow(*r) for r in rows]
        group = _GROUP[by]
        rows = self.conn.execute(
            f"SELECT {group} AS name, COUNT(*), SUM(status >= 400), "
            "COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0) "
            f"FROM requests WHERE ts >= ? GROUP BY {group} ORDER BY name",
            (since or 0.0,),
        ).fetchall()
        return [UsageRow(*r) for r in rows]
