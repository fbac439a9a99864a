"""The portal in a real browser: Debian's chromium, headless, driven by
Selenium through Debian's chromedriver given by path (Selenium Manager never
runs: nothing is downloaded). The acceptance walk: sign up, `letsinfer user
approve` on the CLI, sign in, create a key, the `openai` client uses it, the
request shows on the usage page, sign out, and the old session cookie no
longer works. Each page is photographed into build/screenshots/ (the README
links the main ones)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as seen
from selenium.webdriver.support.ui import WebDriverWait

from tests.nodes import RunningNode, start_node

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"
PASSWORD = "a long enough passphrase"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    running = start_node(tmp_path_factory.mktemp("portal-browser") / "home")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[WebDriver]:
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager: never to the network
    # Chromium keeps its crash reports' settings and GLib its dconf cache under
    # the user's home: the test's own folder stands in for it.
    own = {name: str(tmp_path / name) for name in ("home", "config", "cache")}
    env = {
        **os.environ,
        "HOME": own["home"],
        "XDG_CONFIG_HOME": own["config"],
        "XDG_CACHE_HOME": own["cache"],
    }
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1100,900")
    driver = webdriver.Chrome(
        service=Service(executable_path=CHROMEDRIVER, env=env), options=options
    )
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver: WebDriver, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


def found(driver: WebDriver, element_id: str) -> WebElement:
    """The element, once the page a click asked for has come (argon2 takes a while)."""
    return WebDriverWait(driver, 30).until(seen.presence_of_element_located((By.ID, element_id)))


def at(driver: WebDriver, path: str) -> None:
    WebDriverWait(driver, 30).until(seen.url_contains(path))


def fill(driver: WebDriver, **fields: str) -> None:
    for name, value in fields.items():
        box = driver.find_element(By.NAME, name)
        box.clear()
        box.send_keys(value)


def test_sign_up_approve_sign_in_make_a_key_use_it_see_it_and_sign_out(
    node: RunningNode, browser: WebDriver
) -> None:
    ui = node.url + "/ui"
    browser.get(ui + "/signup")
    fill(browser, name="ada", password=PASSWORD)
    shot(browser, "signup")
    browser.find_element(By.ID, "signup").click()
    assert "waits for an administrator's approval" in found(browser, "message").text

    # Pending: the right password does not sign in yet.
    browser.get(ui + "/signin")
    fill(browser, name="ada", password=PASSWORD)
    browser.find_element(By.ID, "signin").click()
    assert "not active" in found(browser, "error").text

    for args in (("project", "create", "lab"), ("user", "approve", "ada", "--project", "lab")):
        done = node.cli(*args)
        assert done.returncode == 0, done.stderr
    node.cli("user", "grant", "ada", "operator")

    browser.get(ui + "/signin")
    fill(browser, name="ada", password=PASSWORD)
    shot(browser, "signin")
    browser.find_element(By.ID, "signin").click()
    at(browser, "/ui/keys")

    fill(browser, label="notebook")
    browser.find_element(By.ID, "create").click()
    secret = found(browser, "secret").text
    assert secret.startswith("li-")
    shot(browser, "keys")

    answer = node.client(secret).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8
    )
    assert answer.choices[0].message.content

    deadline = time.monotonic() + 30  # the request records are written in the background
    while True:
        browser.get(ui + "/usage")
        rows = browser.find_elements(By.CSS_SELECTOR, "#usage tbody tr")
        if any("tiny" in r.text for r in rows):
            break
        assert time.monotonic() < deadline, browser.page_source
        time.sleep(0.5)
    shot(browser, "usage")

    # The playground: the answer streams from the real engine through the gateway.
    browser.get(ui + "/playground")
    fill(browser, key=secret, prompt="Say hello")
    browser.find_element(By.ID, "send").click()
    WebDriverWait(browser, 60).until(lambda d: d.find_element(By.ID, "answer").text.strip())
    assert "error" not in browser.find_element(By.ID, "answer").get_attribute("innerHTML")
    shot(browser, "playground")

    browser.get(ui + "/models")
    assert "tiny" in browser.find_element(By.ID, "models").text
    shot(browser, "models")
    browser.get(ui + "/operator")
    assert "tiny" in browser.find_element(By.ID, "groups").text
    assert "user.approve" in browser.find_element(By.ID, "audit").text
    shot(browser, "operator")

    session = browser.get_cookie("li_session")
    assert session is not None and session["httpOnly"] and session["sameSite"] == "Strict"
    browser.get(ui + "/keys")
    browser.find_element(By.CSS_SELECTOR, "header form button").click()  # sign out
    at(browser, "/ui/signin")
    replay = httpx.get(
        ui + "/keys", cookies={"li_session": session["value"]}, follow_redirects=False
    )
    assert replay.status_code == 303 and replay.headers["location"] == "/ui/signin"
