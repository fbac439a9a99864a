"""`auth key` limit options and refusals, and model commands given a name that
is not a model's: what an operator types, what they are told, what is audited."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from letsinfer.engines.tinymodel import write_tiny_lora, write_tiny_model
from tests.nodes import RunningNode, letsinfer


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A main with no node running (the CLI writes its authority itself): its
    model tiny with LoRA adapter tiny-tuned, and external model far."""
    home = tmp_path_factory.mktemp("cli-checks") / "home"
    lora = write_tiny_lora(home.parent / "tuned.gguf")
    # Its providers are on loopback (closed ports: nothing is sent there).
    (home / "etc").mkdir(parents=True)
    (home / "etc" / "config.toml").write_text('[fetch]\nallow_networks = ["127.0.0.0/8"]\n')
    for args in (
        ("node", "init", "--main"),
        ("model", "adapter", "add", "tiny", "tiny-tuned", "--gguf", str(lora)),
        ("model", "add", "far", "--external", "http://127.0.0.1:9/v1"),
    ):
        done = letsinfer(home, *args, timeout=120)
        assert done.returncode == 0, (args, done.stderr)
    return home


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return letsinfer(home, *args)


def audit(home: Path) -> list[dict[str, object]]:
    return json.loads(cli(home, "audit", "list", "--json").stdout)  # type: ignore[no-any-return]


def test_off_clears_a_limit_in_any_case_as_the_help_shows_it(home: Path) -> None:
    assert "--rpm N|OFF" in cli(home, "auth", "key", "create", "--help").stdout
    made = cli(
        home,
        *("auth", "key", "create", "offs", "--json"),
        *("--rpm", "OFF", "--tpm", "Off", "--budget", "off", "--cache-ttl", "oFF"),
    )
    assert made.returncode == 0, made.stderr
    issued = json.loads(made.stdout)
    assert (issued["rpm"], issued["tpm"], issued["budget_tokens"], issued["cache_ttl_s"]) == (
        None,
        None,
        None,
        None,
    )

    set_ = cli(home, "auth", "key", "limits", "offs", "--rpm", "60", "--tpm", "900", "--json")
    assert set_.returncode == 0, set_.stderr
    cleared = cli(home, "auth", "key", "limits", "offs", "--rpm", "OFF", "--tpm", "OfF", "--json")
    assert cleared.returncode == 0, cleared.stderr
    policy = json.loads(cleared.stdout)
    assert policy["rpm"] is None and policy["tpm"] is None

    wrong = cli(home, "auth", "key", "limits", "offs", "--rpm", "offf")
    assert wrong.returncode == 2
    assert "'offf' is neither a whole number nor 'off'" in wrong.stderr
    for odd in ("1_000", "+5", "\u0661\u0662", "1e3"):
        refused = cli(home, "auth", "key", "limits", "offs", "--tpm", odd)
        assert refused.returncode == 2 and "neither a whole number" in refused.stderr, odd
    huge = cli(home, "auth", "key", "limits", "offs", "--tpm", "9" * 5000)
    assert huge.returncode == 2 and "the largest limit" in huge.stderr, huge.stderr
    [offs] = [
        k
        for k in json.loads(cli(home, "auth", "key", "list", "--json").stdout)
        if k["name"] == "offs"
    ]
    assert offs["tpm"] is None


def test_refused_key_limits_are_audited_as_denials(home: Path) -> None:
    assert cli(home, "auth", "key", "create", "capped").returncode == 0
    before = len(audit(home))

    no_period = cli(home, "auth", "key", "limits", "capped", "--budget", "100")
    assert no_period.returncode == 1
    assert "a token budget needs its period (day, week or month)" in no_period.stderr
    shown = json.loads(cli(home, "auth", "key", "limits", "capped", "--json").stdout)
    assert shown["budget_tokens"] is None  # nothing half-changed

    created = cli(home, "auth", "key", "create", "loose", "--budget-period", "day")
    assert created.returncode == 1
    assert "a budget period is for a token budget: give the budget too" in created.stderr
    assert "loose" not in cli(home, "auth", "key", "list", "--json").stdout

    unknown = cli(home, "auth", "key", "create", "picky", "--model", "no-such-model")
    assert unknown.returncode == 1 and "does not exist" in unknown.stderr

    missing = cli(home, "auth", "key", "limits", "nobody", "--rpm", "5")
    assert missing.returncode == 1 and "no active API key named 'nobody'" in missing.stderr

    records = audit(home)[before:]
    assert [(r["action"], r["target"], r["outcome"]) for r in records] == [
        ("auth.key.limits", "capped", "denied"),
        ("auth.key.create", "loose", "denied"),
        ("auth.key.create", "picky", "denied"),
        ("auth.key.limits", "nobody", "denied"),
    ]
    assert "needs its period" in str(records[0]["detail"])
    verified = cli(home, "audit", "verify")
    assert verified.returncode == 0, verified.stderr
    assert "not anchored" not in verified.stdout  # each denial signed the head too


@pytest.mark.parametrize(
    "args",
    [("model", "show", "tiny-tuned"), ("model", "show", "tiny-tuned", "--json")]
    + [("model", verb, "tiny-tuned") for verb in ("stop", "start", "resume", "install")],
)
def test_model_commands_say_an_adapter_is_not_a_model(home: Path, args: tuple[str, ...]) -> None:
    before = audit(home)
    done = cli(home, *args, *(["--yes"] if args[1] == "install" else []))
    assert done.returncode == 1, done.stdout
    text = " ".join(done.stderr.split())  # unwrapped
    assert "'tiny-tuned' is a LoRA adapter of model 'tiny', not a model" in text
    assert "see `letsinfer model adapter list tiny`" in text
    assert "no model" not in text
    assert audit(home) == before  # nothing changed, nothing to record


def keys(home: Path) -> dict[str, list[str]]:
    listed = cli(home, "auth", "key", "list", "--json")
    return {k["name"]: k["models"] for k in json.loads(listed.stdout)}


def test_a_removed_model_leaves_no_permission_behind_for_a_later_one_of_its_name(
    home: Path,
) -> None:
    for name in ("gone", "stays"):
        made = cli(home, "model", "add", name, "--external", "http://127.0.0.1:9/v1")
        assert made.returncode == 0, made.stderr
    for key, models in (("only-gone", ("gone",)), ("both", ("gone", "stays"))):
        made = cli(home, "auth", "key", "create", key, *(a for m in models for a in ("--model", m)))
        assert made.returncode == 0, made.stderr
    tuned = cli(home, "auth", "key", "create", "only-tuned", "--model", "tiny-tuned")
    assert tuned.returncode == 0, tuned.stderr
    before, records = keys(home), len(audit(home))

    # Emptied, a key's list would allow every model: the removal waits for it.
    refused = cli(home, "model", "remove", "gone")
    assert refused.returncode == 1
    text = " ".join(refused.stderr.split())
    assert "the API key(s) only-gone may use only model gone" in text
    assert "`letsinfer auth key revoke only-gone`" in text
    adapter = cli(home, "model", "adapter", "remove", "tiny-tuned")
    assert adapter.returncode == 1
    assert "only-tuned may use only LoRA adapter tiny-tuned" in " ".join(adapter.stderr.split())
    assert keys(home) == before
    assert " gone " in cli(home, "model", "list").stdout
    assert [(r["action"], r["target"], r["outcome"]) for r in audit(home)[records:]] == [
        ("model.remove", "gone", "denied"),
        ("model.adapter.remove", "tiny-tuned", "denied"),
    ]

    assert cli(home, "auth", "key", "revoke", "only-gone").returncode == 0
    assert cli(home, "auth", "key", "revoke", "only-tuned").returncode == 0
    removed = cli(home, "model", "remove", "gone")
    assert removed.returncode == 0, removed.stderr
    assert "dropped from the model lists of API keys: both" in removed.stdout
    assert keys(home)["both"] == ["stays"]
    [record] = [r for r in audit(home) if r["action"] == "model.remove" and r["outcome"] == "ok"]
    assert "dropped from the model lists of API keys both" in str(record["detail"])

    # A new model under the old name is not one the key was given.
    assert cli(home, "model", "add", "gone", "--external", "http://127.0.0.2:9/v1").returncode == 0
    assert keys(home)["both"] == ["stays"]


def test_starting_a_model_with_no_group_says_how_to_place_it(home: Path, tmp_path: Path) -> None:
    gguf = write_tiny_model(tmp_path / "idle.gguf")
    added = cli(home, "model", "add", "idle", "--gguf", str(gguf), "--no-serve")
    assert added.returncode == 0, added.stderr
    for verb in ("start", "stop"):
        done = cli(home, "model", verb, "idle")
        assert done.returncode == 0, done.stderr
        assert "model idle: not placed" in done.stdout
        assert "`letsinfer model install idle` places it" in " ".join(done.stdout.split())


def test_model_list_shows_an_external_model_without_groups_or_file(home: Path) -> None:
    listed = cli(home, "model", "list")
    assert listed.returncode == 0, listed.stderr
    far = next(line for line in listed.stdout.splitlines() if " far " in f" {line} ")
    assert "0/0" not in far and "0.0 MB" not in far
    assert "external" in far and "serving" in far
    tiny = next(line for line in listed.stdout.splitlines() if " tiny " in f" {line} ")
    assert "0/1" in tiny and "0.5 MB" in tiny  # a model of its own engines: as before

    rows = {r["name"]: r for r in json.loads(cli(home, "model", "list", "--json").stdout)}
    assert (rows["far"]["ready"], rows["far"]["total"], rows["far"]["size"]) == (0, 0, 0)


def test_a_running_node_gets_no_refused_limits_and_the_refusal_is_audited_once(
    main_node: RunningNode,
) -> None:
    made = main_node.cli("auth", "key", "create", "live", "--rpm", "OFF", "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["rpm"] is None
    before = len(json.loads(main_node.cli("audit", "list", "--json").stdout))

    refused = main_node.cli("auth", "key", "limits", "live", "--budget", "100")
    assert refused.returncode == 1
    assert "a token budget needs its period (day, week or month)" in refused.stderr

    records = json.loads(main_node.cli("audit", "list", "--json").stdout)[before:]
    denials = [r for r in records if r["action"] == "auth.key.limits"]
    assert [(r["target"], r["outcome"]) for r in denials] == [("live", "denied")]
    policy = json.loads(main_node.cli("auth", "key", "limits", "live", "--json").stdout)
    assert policy["budget_tokens"] is None


def test_limits_the_records_cannot_rebuild_after_a_restart_are_pointed_out(home: Path) -> None:
    config = home / "etc/config.toml"
    before = config.read_text() if config.exists() else None
    try:
        config.write_text((before or "") + "\n[requests]\nkeep_days = 7\n")
        made = cli(
            home, *("auth", "key", "create", "monthly", "--budget", "9", "--budget-period", "month")
        )
        assert made.returncode == 0, made.stderr
        assert "kept 7 day(s) ([requests] keep_days), less than a month" in made.stderr
        weekly = cli(home, "auth", "key", "limits", "monthly", "--budget-period", "week")
        assert weekly.returncode == 0 and "note:" not in weekly.stderr, weekly.stderr

        config.write_text((before or "") + "\n[requests]\nenabled = false\n")
        rated = cli(home, "auth", "key", "limits", "monthly", "--rpm", "10")
        assert rated.returncode == 0
        assert "request records are off ([requests] enabled = false)" in rated.stderr
        plain = cli(home, "auth", "key", "create", "unlimited")
        assert plain.returncode == 0 and "note:" not in plain.stderr
    finally:
        if before is None:
            config.unlink()
        else:
            config.write_text(before)
