"""Request tags (X-Letsinfer-Tags): read on both request paths, kept in the
request records, summed by tag; tags out of bounds refused with a 400."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from benchmarks.mock_upstream import MockBehaviour
from letsinfer.gateway import tags
from letsinfer.gateway.errors import GatewayError
from letsinfer.store.requests import RequestRecord, RequestStore
from tests.gateway_harness import GatewayHarness, chat
from tests.test_gateway_express import express_takes  # noqa: F401 (a fixture)


def test_tags_are_kept_distinct_in_the_order_sent() -> None:
    assert tags.parse(b" team-a, exp:7 ,team-a,,") == '["team-a","exp:7"]'
    assert tags.parse(b" , ") is None


@pytest.mark.parametrize(
    ("header", "says"),
    [
        (b",".join(b"t%d" % i for i in range(tags.MAX_TAGS + 1)), "more than 8 tags"),
        (b"x" * (tags.MAX_TAG_CHARS + 1), "1 to 64 letters"),
        (b"ok,with space", '"with space"'),
        (b"caf\xc3\xa9", "not allowed"),
    ],
)
def test_tags_out_of_bounds_are_refused(header: bytes, says: str) -> None:
    with pytest.raises(GatewayError) as refused:
        tags.parse(header)
    assert refused.value.status == 400 and says in refused.value.message
    assert refused.value.param == "X-Letsinfer-Tags" and refused.value.code == "invalid_tags"


def _post(h: GatewayHarness, client: httpx.Client, request_id: str, tagged: str | None):
    headers = {**h.auth(), "x-request-id": request_id}
    if tagged is not None:
        headers["x-letsinfer-tags"] = tagged
    return client.post(h.url + "/v1/chat/completions", json=chat(), headers=headers)


def test_tags_reach_the_records_on_both_paths_and_bad_ones_are_refused(
    tmp_path: Path,
    express_takes: list[str],  # noqa: F811
) -> None:
    with (
        GatewayHarness(tmp_path, {"pg-a": MockBehaviour(tokens=3)}, records=True) as h,
        httpx.Client() as client,
    ):
        # No kept engine connection yet: the handler answers the first.
        assert _post(h, client, "handled", "team-a,exp").status_code == 200
        assert express_takes == []
        assert _post(h, client, "express", "team-b").status_code == 200
        assert _post(h, client, "untagged", None).status_code == 200
        assert express_takes == ["express", "untagged"]
        bad = _post(h, client, "bad", "a" * 65)
        assert bad.status_code == 400
        assert bad.json()["error"]["param"] == "X-Letsinfer-Tags"
        assert bad.json()["error"]["code"] == "invalid_tags"
        assert "bad" not in express_takes
        assert h.mocks["pg-a"].stats.requests == 3  # the refused one reached no engine
    store = RequestStore(tmp_path / "requests.db", readonly=True)
    assert [r.tags for r in store.find("handled")] == ['["team-a","exp"]']
    assert [r.tags for r in store.find("express")] == ['["team-b"]']
    assert [r.tags for r in store.find("untagged")] == [None]
    assert [(r.status, r.tags) for r in store.find("bad")] == [(400, None)]
    by_tag = {u.name: u.requests for u in store.usage("tag")}
    assert by_tag == {"exp": 1, "team-a": 1, "team-b": 1}


def test_usage_by_tag_counts_a_request_under_each_of_its_tags(tmp_path: Path) -> None:
    def record(rid: str, tagged: str | None, status: int = 200) -> RequestRecord:
        return RequestRecord(
            1.0, rid, "k", "m", "pg", "n", "chat", False, status, 2, 3, 1.0, 2.0, 0.0, tags=tagged
        )

    store = RequestStore(tmp_path / "requests.db")
    store.insert_many([record("1", '["a","b"]'), record("2", '["a"]', 500), record("3", None)])
    assert [tuple(u) for u in store.usage("tag")] == [("a", 2, 1, 4, 6), ("b", 1, 0, 2, 3)]
    assert store.usage("tag", since=5.0) == []
