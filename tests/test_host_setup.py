"""What the test setup (`./dev test` as root) leaves on the host: the Debian
packages the tests need, no service enabled at boot that was not before, and
no trace of how it kept services from starting."""

from __future__ import annotations

import pytest

from tasks import ENABLED_BEFORE, POLICY_RC_D, TEST_SYSTEM_PACKAGES, enabled_units


def test_the_test_setup_enables_no_service_at_boot() -> None:
    if not ENABLED_BEFORE.exists():
        pytest.skip("the test setup (./dev test as root) has not run in this checkout")
    before = set(ENABLED_BEFORE.read_text().split())
    assert enabled_units() - before == set(), "enabled by the test setup"


def test_the_test_setup_leaves_services_free_to_start_again() -> None:
    if POLICY_RC_D.exists():
        assert "letsinfer" not in POLICY_RC_D.read_text(), f"{POLICY_RC_D} left behind"


def test_the_readme_names_every_package_the_test_setup_installs() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    missing = [p for p in TEST_SYSTEM_PACKAGES if f"`{p}`" not in readme]
    assert missing == [], "README.md does not list them"
