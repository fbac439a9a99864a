"""Release signing as an operator uses it: keygen, sign, verify against the node's trust."""

from __future__ import annotations

import json
import stat
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.nodes import letsinfer


def keygen(home: Path, out: Path) -> str:
    result = letsinfer(home, "release", "keygen", "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["public_key"]


def trust(home: Path, *public_keys: str) -> None:
    (home / "etc").mkdir(parents=True, exist_ok=True)
    listed = ", ".join(f'"{k}"' for k in public_keys)
    (home / "etc" / "config.toml").write_text(f"[release]\ntrusted_keys = [{listed}]\n")


@pytest.fixture(scope="module")
def signing_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Two key pairs: "release" (the node trusts it) and "other" (it does not)."""
    home = tmp_path_factory.mktemp("signer")
    return {
        name: (home / f"{name}.key", keygen(home, home / f"{name}.key"))
        for name in ("release", "other")
    }


@pytest.fixture
def signed(tmp_path: Path, signing_keys: dict[str, tuple[Path, str]]) -> tuple[Path, Path, str]:
    """A release file signed by a key the node at ``tmp_path/node`` trusts."""
    key, public = signing_keys["release"]
    trust(tmp_path / "node", public)
    release = tmp_path / "release.json"
    release.write_text('{"id": "llama.cpp-xllamacpp-1.0-cpu"}\n')
    result = letsinfer(tmp_path / "signer", "release", "sign", str(release), "--key", str(key))
    assert result.returncode == 0, result.stderr
    return release, key, public


def test_keygen_prints_the_trust_lines_for_config_toml_and_for_an_ansible_inventory(
    tmp_path: Path,
) -> None:
    result = letsinfer(tmp_path / "home", "release", "keygen", "--out", str(tmp_path / "k"))
    assert result.returncode == 0, result.stderr
    public = (tmp_path / "k.pub").read_text().strip()
    lines = result.stdout.splitlines()

    toml_at = lines.index("[release]")
    assert tomllib.loads("\n".join(lines[toml_at : toml_at + 2])) == {
        "release": {"trusted_keys": [public]}
    }
    yaml_at = lines.index("node_release_trusted_keys:")
    assert yaml.safe_load("\n".join(lines[yaml_at:])) == {"node_release_trusted_keys": [public]}


def test_keygen_writes_a_private_key_only_its_owner_can_read(tmp_path: Path) -> None:
    key = tmp_path / "keys" / "release.key"
    public = keygen(tmp_path / "home", key)

    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in key.read_bytes()
    assert (tmp_path / "keys" / "release.key.pub").read_text().strip() == public
    assert public.startswith("ed25519:")

    before = key.read_bytes()
    again = letsinfer(tmp_path / "home", "release", "keygen", "--out", str(key))
    assert again.returncode == 1
    assert "already exists; refusing to overwrite" in again.stderr
    assert key.read_bytes() == before


def test_keygen_prints_the_config_lines_that_trust_the_key(tmp_path: Path) -> None:
    result = letsinfer(tmp_path / "home", "release", "keygen")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "home" / "etc" / "release-signing.key").is_file()
    public = (tmp_path / "home" / "etc" / "release-signing.key.pub").read_text().strip()
    assert f'[release]\ntrusted_keys = ["{public}"]' in result.stdout


def test_a_trusted_signature_verifies(signed: tuple[Path, Path, str], tmp_path: Path) -> None:
    release, _, public = signed
    assert json.loads(release.with_name("release.json.sig").read_text())["key"] == public
    result = letsinfer(tmp_path / "node", "release", "verify", str(release))
    assert result.returncode == 0, result.stderr
    assert "good signature by trusted key" in result.stdout


def test_a_file_changed_after_signing_is_refused(
    signed: tuple[Path, Path, str], tmp_path: Path
) -> None:
    release, _, _ = signed
    release.write_text('{"id": "llama.cpp-xllamacpp-6.6.6-cpu"}\n')
    result = letsinfer(tmp_path / "node", "release", "verify", str(release))
    assert result.returncode == 1
    assert "was changed after signing" in result.stderr


def test_a_signature_by_another_key_is_refused(
    signed: tuple[Path, Path, str], signing_keys: dict[str, tuple[Path, str]], tmp_path: Path
) -> None:
    release, _, _ = signed
    other, _ = signing_keys["other"]
    resigned = letsinfer(tmp_path / "signer", "release", "sign", str(release), "--key", str(other))
    assert resigned.returncode == 0, resigned.stderr

    result = letsinfer(tmp_path / "node", "release", "verify", str(release))
    assert result.returncode == 1
    assert "which this node does not trust" in result.stderr


def test_unsigned_content_is_refused_where_a_key_is_trusted(
    signed: tuple[Path, Path, str], tmp_path: Path
) -> None:
    release, _, _ = signed
    release.with_name("release.json.sig").unlink()
    result = letsinfer(tmp_path / "node", "release", "verify", str(release))
    assert result.returncode == 1
    assert "is unsigned, and this node trusts release keys" in result.stderr


def test_a_node_that_trusts_no_key_accepts_no_signature(
    signed: tuple[Path, Path, str], tmp_path: Path
) -> None:
    release, _, _ = signed
    result = letsinfer(tmp_path / "fresh", "release", "verify", str(release))
    assert result.returncode == 1
    assert "this node trusts no release key" in result.stderr


def test_a_forged_signature_is_refused(signed: tuple[Path, Path, str], tmp_path: Path) -> None:
    release, _, _ = signed
    sig_file = release.with_name("release.json.sig")
    doc = json.loads(sig_file.read_text())
    doc["signature"] = "A" * 86 + "=="  # 64 bytes, not a signature of anything
    sig_file.write_text(json.dumps(doc))
    result = letsinfer(tmp_path / "node", "release", "verify", str(release))
    assert result.returncode == 1
    assert "is not valid (the signature itself was altered or forged)" in result.stderr


def test_verify_can_name_the_key_to_trust_instead_of_the_config(
    signed: tuple[Path, Path, str], tmp_path: Path
) -> None:
    release, key, _ = signed
    pub_file = key.with_name("release.key.pub")
    result = letsinfer(
        tmp_path / "fresh", "release", "verify", str(release), "--key", str(pub_file)
    )
    assert result.returncode == 0, result.stderr


def test_signing_refuses_a_private_key_others_can_read(
    signed: tuple[Path, Path, str], tmp_path: Path
) -> None:
    release, key, _ = signed
    loose = tmp_path / "loose.key"
    loose.write_bytes(key.read_bytes())
    loose.chmod(0o644)
    result = letsinfer(tmp_path / "signer", "release", "sign", str(release), "--key", str(loose))
    assert result.returncode == 1
    assert "chmod 600" in result.stderr


def test_a_malformed_trusted_key_stops_the_command_naming_the_setting(tmp_path: Path) -> None:
    trust(tmp_path / "node", "ed25519:not-a-key")
    (tmp_path / "f").write_text("x")
    result = letsinfer(tmp_path / "node", "release", "verify", str(tmp_path / "f"))
    assert result.returncode == 2
    assert "release.trusted_keys" in result.stderr


def test_trusted_keys_can_come_from_the_environment(
    signed: tuple[Path, Path, str], tmp_path: Path
) -> None:
    release, _, public = signed
    env = {"LETSINFER_RELEASE__TRUSTED_KEYS": f"{public},{public}"}
    result = letsinfer(tmp_path / "fresh", "release", "verify", str(release), env=env)
    assert result.returncode == 0, result.stderr
