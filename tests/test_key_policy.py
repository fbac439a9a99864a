"""API-key policy at the gateway when the authority store fails."""

from __future__ import annotations

from pathlib import Path

import httpx

from benchmarks.mock_upstream import MockBehaviour
from tests.gateway_harness import MODEL, GatewayHarness


def test_a_dead_store_is_503_never_401(tmp_path: Path) -> None:
    with GatewayHarness(tmp_path, {"pg-a": MockBehaviour()}) as gw:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        url = gw.url + "/v1/chat/completions"
        assert httpx.post(url, json=body, headers=gw.auth()).status_code == 200

        gw.directory.max_stale_s = 0.0  # any snapshot is now too old
        gw.in_loop(gw.store.close)  # and the store cannot be read again
        gw.in_loop(gw.directory.refresh)
        for headers in (gw.auth(), {"authorization": "Bearer li-unknown"}):
            resp = httpx.post(url, json=body, headers=headers)
            assert resp.status_code == 503, resp.text
            assert resp.json()["error"]["code"] == "authority_unavailable"
            assert resp.headers["retry-after"]
        gw.store = type(gw.store)(tmp_path / "authority.db")  # so teardown can close it
