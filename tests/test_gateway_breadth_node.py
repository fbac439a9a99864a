"""The gateway's breadth on a real main node: an external provider over
verified TLS whose key stays out of everything, a fallback to it, a real LoRA
adapter applied by the real engine, and a spent budget that outlives a restart."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from letsinfer.engines.tinymodel import LORA_SENTENCE, SENTENCE, write_tiny_lora
from tests.nodes import RunningNode, start_node
from tests.provider import ANSWER, Provider, make_tls

CHAT = [{"role": "user", "content": "Say something."}]
SECRET = "sk-provider-b7d1c0ffee-never-shown"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    # Its provider is on loopback: a site lists the networks its providers are on.
    running = start_node(
        tmp_path_factory.mktemp("breadth") / "home",
        env={"LETSINFER_FETCH__ALLOW_NETWORKS": "127.0.0.0/8"},
    )
    try:
        yield running
    finally:
        running.stop()


def ask(node: RunningNode, model: str, key: str | None = None, **extra: Any) -> httpx.Response:
    return httpx.post(
        node.url + "/v1/chat/completions",
        json={"model": model, "messages": CHAT, **extra},
        headers={"authorization": f"Bearer {key or node.key}"},
        timeout=60,
    )


def eventually(check: Callable[[], Any], timeout: float = 60) -> Any:
    """``check()``'s first truthy result (the node applies changes within a second or so)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout}s: {check}")
        time.sleep(0.1)


def ok(result: Any) -> str:
    assert result.returncode == 0, result.stderr
    return str(result.stdout)


def content(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def test_an_external_model_over_verified_tls_serves_and_its_key_stays_out_of_everything(
    node: RunningNode, tmp_path: Path
) -> None:
    tls = make_tls(tmp_path / "tls")
    key_file = tmp_path / "provider.key"
    key_file.write_text(SECRET + "\n")
    key_file.chmod(0o600)
    with Provider(key=SECRET, model="prov-m", tls=tls) as provider:
        add = ["model", "add", "ext", "--external", provider.url, "--provider-model", "prov-m"]
        # Refused before anything changes: a key file everyone can read.
        loose = tmp_path / "loose.key"
        loose.write_text(SECRET + "\n")
        loose.chmod(0o644)
        refused = node.cli(*add, "--key-file", str(loose), "--ca-file", str(tls.ca))
        assert refused.returncode == 1 and "can be read by every user" in refused.stderr
        names = [m["name"] for m in json.loads(ok(node.cli("model", "list", "--json")))]
        assert names == ["tiny"]

        ok(node.cli(*add, "--key-file", str(key_file), "--ca-file", str(tls.ca)))
        # The same provider without its CA: TLS is verified, so it gets nothing.
        ok(
            node.cli(
                "model", "add", "ext-unverified", "--external", provider.url,
                "--provider-model", "prov-m", "--key-file", str(key_file),
            )
        )  # fmt: skip

        assert eventually(lambda: ask(node, "ext").status_code == 200)
        assert content(ask(node, "ext")) == ANSWER
        seen = provider.seen[-1]
        assert seen.headers["authorization"] == f"Bearer {SECRET}"
        assert seen.body["model"] == "prov-m" and seen.body["messages"] == CHAT
        assert seen.headers["x-request-id"]

        streamed = node.client().chat.completions.create(
            model="ext", messages=CHAT, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(streamed)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip() == (
            ANSWER
        )
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4

        before = len(provider.seen)
        unverified = eventually(lambda: (r := ask(node, "ext-unverified")).status_code != 404 and r)
        assert unverified.status_code == 503, unverified.text
        assert "certificate" in unverified.json()["error"]["message"]
        assert "127.0.0.1" not in unverified.text  # why, not where: the log has that
        assert len(provider.seen) == before, "no request (and no key) went to an unverified peer"

        # The only group of tiny stops: its fallback answers, and says so, from
        # the moment `model fallback` returns (the node applies it before).
        ok(node.cli("model", "stop", "tiny"))
        assert eventually(lambda: ask(node, "tiny").status_code == 503)
        ok(node.cli("model", "fallback", "tiny", "ext"))
        fell = ask(node, "tiny")
        assert fell.status_code == 200 and fell.headers["x-letsinfer-fallback"] == "ext"
        assert content(fell) == ANSWER and fell.json()["model"] == "ext"
        assert provider.seen[-1].body["model"] == "prov-m"
        ok(node.cli("model", "fallback", "tiny", "--clear"))
        assert ask(node, "tiny").json()["error"]["code"] == "model_stopped"
        wrong = node.cli("model", "fallback", "tiny", "nosuch")
        assert wrong.returncode == 1 and "'nosuch': no such model" in wrong.stderr
        denied = [
            r
            for r in json.loads(ok(node.cli("audit", "list", "--json")))
            if r["action"] == "model.fallback" and r["outcome"] == "denied"
        ]
        assert len(denied) == 1 and "nosuch" in denied[0]["detail"]
        ok(node.cli("model", "start", "tiny"))
        back = eventually(lambda: (r := ask(node, "tiny")).status_code == 200 and r)
        assert "x-letsinfer-fallback" not in back.headers and content(back) == SENTENCE

        # Stopping the provider's model stops sending it requests, until started.
        assert "model ext: stopped" in ok(node.cli("model", "stop", "ext"))
        stopped = eventually(lambda: (r := ask(node, "ext")).status_code == 503 and r)
        assert stopped.json()["error"]["code"] == "model_stopped"
        assert "model ext: serving" in ok(node.cli("model", "start", "ext", "--wait"))
        assert content(eventually(lambda: (r := ask(node, "ext")).status_code == 200 and r)) == (
            ANSWER
        )

        shown = ok(node.cli("model", "show", "ext", "--json"))
        assert json.loads(shown)["external"]["key_file"] == str(key_file)
        listed = ok(node.cli("model", "list", "--json")) + ok(node.cli("model", "show", "ext"))
        audit = ok(node.cli("audit", "list", "--json"))
        for text in (shown, listed, audit, node.log()):
            assert SECRET not in text
        for path in node.home.rglob("*"):  # the authority, the records, logs, config
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path

        for name in ("ext", "ext-unverified"):
            ok(node.cli("model", "remove", name))
        assert eventually(lambda: ask(node, "ext").status_code == 404)


def test_a_lora_adapter_is_served_by_name_by_its_base_models_engine(
    node: RunningNode, tmp_path: Path, tiny_gguf: Path
) -> None:
    lora = write_tiny_lora(tmp_path / "tiny-lora.gguf")
    misfit = write_tiny_lora(tmp_path / "misfit.gguf", rows=100)
    add = ["model", "adapter", "add", "tiny"]
    bad = node.cli(*add, "tiny-misfit", "--gguf", str(misfit))
    assert bad.returncode == 1 and "output.weight" in bad.stderr and "Nothing changed" in bad.stderr
    not_lora = node.cli(*add, "tiny-misfit", "--gguf", str(tiny_gguf))
    assert not_lora.returncode == 1 and "not a LoRA adapter" in not_lora.stderr
    taken = node.cli(*add, "tiny", "--gguf", str(lora))
    assert taken.returncode == 1 and "already exists" in taken.stderr
    assert json.loads(ok(node.cli("model", "adapter", "list", "--json"))) == []

    out = ok(node.cli(*add, "tiny-lora", "--gguf", str(lora)))
    assert "ready" in out  # tiny's group restarted with the adapter loaded
    assert content(ask(node, "tiny-lora")) == LORA_SENTENCE  # the engine applied it
    assert content(ask(node, "tiny-lora", stream=False, temperature=1.5)) == LORA_SENTENCE
    assert content(ask(node, "tiny")) == SENTENCE  # and only to the requests that name it

    models = httpx.get(
        node.url + "/v1/models", headers={"authorization": f"Bearer {node.key}"}
    ).json()["data"]
    assert {m["id"]: m.get("parent") for m in models} == {"tiny": None, "tiny-lora": "tiny"}
    listed = json.loads(ok(node.cli("model", "adapter", "list", "tiny", "--json")))
    assert [(a["name"], a["model"], a["fallback"]) for a in listed] == [("tiny-lora", "tiny", None)]
    said = ok(node.cli("model", "fallback", "tiny-lora", "tiny"))  # an adapter's own
    assert "model tiny-lora: falls back to tiny" in said
    listed = json.loads(ok(node.cli("model", "adapter", "list", "--json")))
    assert [a["fallback"] for a in listed] == ["tiny"]

    base_only = json.loads(
        ok(node.cli("auth", "key", "create", "base-only", "--model", "tiny", "--json"))
    )
    lora_only = json.loads(
        ok(node.cli("auth", "key", "create", "lora-only", "--model", "tiny-lora", "--json"))
    )
    assert ask(node, "tiny-lora", base_only["key"]).status_code == 404
    forged = ask(node, "tiny", base_only["key"], lora=[{"id": 0, "scale": 1.0}])
    assert forged.status_code == 400  # no adapter by id past the allowlist
    assert content(ask(node, "tiny-lora", lora_only["key"])) == LORA_SENTENCE
    assert ask(node, "tiny", lora_only["key"]).status_code == 404

    # Its last model gone, lora-only would allow every model: revoked first.
    kept = node.cli("model", "adapter", "remove", "tiny-lora")
    assert kept.returncode == 1 and "lora-only may use only" in " ".join(kept.stderr.split())
    assert content(ask(node, "tiny-lora", lora_only["key"])) == LORA_SENTENCE
    ok(node.cli("auth", "key", "revoke", "lora-only"))
    ok(node.cli("model", "adapter", "remove", "tiny-lora"))
    assert ask(node, "tiny-lora").status_code == 404
    assert content(ask(node, "tiny")) == SENTENCE


def test_a_key_made_again_under_a_revoked_name_carries_on_its_spending(
    node: RunningNode,
) -> None:
    """Limits count per name: a rotated key (revoked, made again under its
    name) cannot reset a spent budget, and says so; another name starts afresh."""
    made = ok(
        node.cli("auth", "key", "create", "rotated", "--budget", "30", "--budget-period", "day")
    )
    [old] = [line for line in made.splitlines() if line.startswith("li-")]
    assert "follows" not in made
    statuses = [ask(node, "tiny", old).status_code for _ in range(12)]  # 30 tokens: a few
    assert statuses[-1] == 429 and 200 in statuses, statuses
    ok(node.cli("auth", "key", "revoke", "rotated"))
    assert ask(node, "tiny", old).status_code == 401

    again = ok(
        node.cli("auth", "key", "create", "rotated", "--budget", "30", "--budget-period", "day")
    )
    [new] = [line for line in again.splitlines() if line.startswith("li-")]
    assert new != old
    assert "follows 1 revoked key(s) named rotated" in " ".join(again.split())
    refused = ask(node, "tiny", new)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "budget_exhausted"

    fresh = json.loads(
        ok(
            node.cli(
                "auth", "key", "create", "unrotated", "--budget", "30", "--budget-period", "day",
                "--json",
            )
        )
    )  # fmt: skip
    assert fresh["succeeds_revoked"] == 0
    assert content(ask(node, "tiny", fresh["key"])) == SENTENCE


def test_removing_the_only_model_of_a_key_is_refused_through_the_node_and_it_serves_on(
    node: RunningNode,
) -> None:
    """Through the running node (its ops route, which drains for --stop): the
    refusal, and the model still serving after it. (With nothing in flight a
    drain ends at once, so this does not tell whether it drained first.)"""
    ok(node.cli("auth", "key", "create", "only-tiny", "--model", "tiny"))
    try:
        refused = node.cli("model", "remove", "tiny", "--stop")
        assert refused.returncode == 1, refused.stdout
        assert "only-tiny may use only model tiny" in " ".join(refused.stderr.split())
        assert content(ask(node, "tiny")) == SENTENCE  # still serving: nothing drained
    finally:
        ok(node.cli("auth", "key", "revoke", "only-tiny"))


def test_a_spent_budget_stays_spent_across_a_restart(tmp_path: Path) -> None:
    # A node of its own: the restart would leave the module's node stopped.
    node = start_node(tmp_path / "home")
    try:
        spend_and_restart(node)
    finally:
        node.stop()


def spend_and_restart(node: RunningNode) -> None:
    made = ok(
        node.cli(
            "auth", "key", "create", "metered", "--budget", "40", "--budget-period", "day",
            "--band", "batch", "--json",
        )
    )  # fmt: skip
    key = json.loads(made)["key"]
    statuses = []
    while len(statuses) < 10 and (not statuses or statuses[-1] == 200):
        statuses.append(ask(node, "tiny", key).status_code)
    assert statuses[-1] == 429 and set(statuses[:-1]) == {200}
    refused = ask(node, "tiny", key)
    assert refused.json()["error"]["code"] == "budget_exhausted"
    assert int(refused.headers["retry-after"]) >= 1

    node.stop()
    again = start_node(node.home)
    try:
        after = ask(again, "tiny", key)
        assert after.status_code == 429 and after.json()["error"]["code"] == "budget_exhausted"
        shown = json.loads(ok(again.cli("auth", "key", "limits", "metered", "--json")))
        assert (shown["budget_tokens"], shown["band"]) == (40, "batch")
        too_big = again.cli("auth", "key", "limits", "metered", "--rpm", str(10**20))
        assert too_big.returncode == 2 and "the largest limit" in too_big.stderr
        ok(again.cli("auth", "key", "limits", "metered", "--budget", "off", "--rpm", "100"))
        assert content(ask(again, "tiny", key)) == SENTENCE
    finally:
        again.stop()
