"""The web console in a real browser: headless Chromium (Debian's chromium + chromium-driver) via selenium,
against `kubeon-gpu hub serve`. Real: the browser, the hub process, its database. Faked: nothing; the
optimizer's side (polls, a reported proposal) is played with plain HTTP calls on the cluster API."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

from tests.hub.browsing import click_through
from tests.hub.conftest import ADMIN, HubProcess, start_hub
from tests.loopback import wait_for
from tests.missing import missing

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
NAME = "prod'; DROP TABLE clusters;--"


@pytest.fixture
def browser() -> Iterator[object]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        missing("chromium and chromium-driver are not installed: scripts/install-test-deps.sh installs them")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.implicitly_wait(5)
    yield driver
    driver.quit()


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    process = start_hub(f"sqlite:///{tmp_path}/hub.db")
    yield process
    process.stop()


def _poll(hub: HubProcess, token: str) -> int:
    return requests.get(f"{hub.url}/api/v1/clusters/{quote(NAME, safe='')}/policies",
                        headers={"Authorization": f"Bearer {token}"}, timeout=5).status_code


def _policy_set(hub: HubProcess, token: str) -> dict[str, Any]:
    answer = requests.get(f"{hub.url}/api/v1/clusters/{quote(NAME, safe='')}/policies", timeout=5,
                          headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200
    body: dict[str, Any] = answer.json()
    return body


def test_console_end_to_end(browser: object, hub: HubProcess) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    d = browser
    # no session: every page sends the browser to sign-in
    d.get(hub.url + "/console/audit")  # type: ignore[attr-defined]
    assert "/console/sign-in" in d.current_url  # type: ignore[attr-defined]
    d.find_element(By.ID, "credential").send_keys("wrong")  # type: ignore[attr-defined]
    click_through(d, By.CSS_SELECTOR, "button[type=submit]")
    assert d.find_element(By.ID, "credential-error").text == "That is not the admin credential."  # type: ignore[attr-defined]
    d.find_element(By.ID, "credential").send_keys(ADMIN)  # type: ignore[attr-defined]
    click_through(d, By.CSS_SELECTOR, "main button[type=submit]")
    wait_for(lambda: d.current_url.endswith("/console/audit"),  # type: ignore[attr-defined]
             what="sign-in to lead back to the page asked for")

    # Add cluster: the token is shown once
    click_through(d, By.LINK_TEXT, "Clusters")
    d.find_element(By.ID, "name").send_keys(NAME)  # type: ignore[attr-defined]
    click_through(d, By.XPATH, "//button[text()='Add cluster']")
    token = d.find_element(By.ID, "token").text  # type: ignore[attr-defined]
    assert token.startswith("kgo_")
    assert _poll(hub, token) == 200
    click_through(d, By.LINK_TEXT, "Clusters")
    assert token not in d.page_source  # type: ignore[attr-defined]
    assert d.find_element(By.LINK_TEXT, NAME)  # type: ignore[attr-defined]  # the SQL-looking name, literally
    assert d.find_element(By.CSS_SELECTOR, "td[data-state]").text == "connected"  # type: ignore[attr-defined]

    # Rotate token, with a confirmation
    click_through(d, By.LINK_TEXT, NAME)
    click_through(d, By.LINK_TEXT, "Rotate token")
    assert "Rotate the token of" in d.find_element(By.TAG_NAME, "h1").text  # type: ignore[attr-defined]
    click_through(d, By.XPATH, "//button[text()='Yes, rotate the token']")
    rotated = d.find_element(By.ID, "token").text  # type: ignore[attr-defined]
    assert rotated.startswith("kgo_") and rotated != token
    assert _poll(hub, token) == 200, "the old token works until the new one is used"
    assert _poll(hub, rotated) == 200
    assert _poll(hub, token) == 401

    # a policy with an invalid field: the message stands next to the field
    click_through(d, By.PARTIAL_LINK_TEXT, "Go to")
    click_through(d, By.LINK_TEXT, "Add policy")
    d.find_element(By.ID, "name").send_keys("llm-sharing")  # type: ignore[attr-defined]
    Select(d.find_element(By.ID, "mode")).select_by_value("Approve")  # type: ignore[attr-defined]
    spec = d.find_element(By.ID, "spec")  # type: ignore[attr-defined]
    spec.clear()
    spec.send_keys("sharing:\n  strategy: MIG\n  migProfle: auto\n")
    click_through(d, By.XPATH, "//button[text()='Save policy']")
    error = d.find_element(By.ID, "spec-error")  # type: ignore[attr-defined]
    assert "sharing.migProfle" in error.text and "Extra inputs are not permitted" in error.text
    assert d.find_element(By.ID, "spec").get_attribute("aria-describedby") == "spec-error"  # type: ignore[attr-defined]
    # a value YAML cannot read (PyYAML raises a bare ValueError for it): a message, not a server error
    spec = d.find_element(By.ID, "spec")  # type: ignore[attr-defined]
    spec.clear()
    spec.send_keys("sharing:\n  strategy: TimeSlicing\n  timeSlicingReplicas: !!int x\n")
    click_through(d, By.XPATH, "//button[text()='Save policy']")
    error = d.find_element(By.ID, "spec-error")  # type: ignore[attr-defined]
    assert error.text == "not valid YAML at line 3, column 24: int value 'x' cannot be read", error.text
    spec = d.find_element(By.ID, "spec")  # type: ignore[attr-defined]
    spec.clear()
    spec.send_keys("selector:\n  namespaces: [inference]\nsharing:\n  strategy: MIG\n")
    click_through(d, By.XPATH, "//button[text()='Save policy']")
    assert d.find_element(By.LINK_TEXT, "llm-sharing")  # type: ignore[attr-defined]

    # the mode switch
    Select(d.find_element(By.ID, "mode-1")).select_by_value("Automatic")  # type: ignore[attr-defined]
    click_through(d, By.XPATH, "//button[text()='Set mode']")
    wait_for(lambda: _policy_set(hub, rotated)["policies"][0]["spec"]["mode"] == "Automatic",
             what="the mode switch to reach the hub")

    # a proposal the optimizer reports, approved in the console, reaches the cluster's next poll
    action = {"id": "p-1", "policy": "llm-sharing", "target": "Deployment/inference/llm",
              "action": "nvidia.com/gpu=1 → nvidia.com/mig-1g.10gb", "mode": "Approve", "result": "proposed",
              "time": 1_800_000_000.0}
    assert requests.post(f"{hub.url}/api/v1/clusters/{quote(NAME, safe='')}/actions", json={"actions": [action]},
                         headers={"Authorization": f"Bearer {rotated}", "Idempotency-Key": "k1"},
                         timeout=5).status_code == 200
    d.refresh()  # type: ignore[attr-defined]
    click_through(d, By.CSS_SELECTOR, "button[aria-label='Approve Deployment/inference/llm']")
    wait_for(lambda: [(a["policy"], a["target"]) for a in _policy_set(hub, rotated)["approvals"]]
             == [("llm-sharing", "Deployment/inference/llm")], what="the approval to reach the cluster's poll")
    assert d.find_element(By.CSS_SELECTOR, "button[aria-label='Withdraw approval of Deployment/inference/llm']")  # type: ignore[attr-defined]

    # Revoke token, with a confirmation: the cluster shows disconnected, its token is refused
    click_through(d, By.LINK_TEXT, "Revoke token")
    click_through(d, By.XPATH, "//button[text()='Yes, revoke the token']")
    wait_for(lambda: _poll(hub, rotated) == 401, what="the revoked token to be refused")
    d.refresh()  # type: ignore[attr-defined]
    assert d.find_element(By.ID, "cluster-state").text == "disconnected"  # type: ignore[attr-defined]
    click_through(d, By.XPATH, "//button[text()='Create token']")
    fresh = d.find_element(By.ID, "token").text  # type: ignore[attr-defined]
    assert fresh.startswith("kgo_") and _poll(hub, fresh) == 200

    # the audit log says who did what
    click_through(d, By.LINK_TEXT, "Audit log")
    audit = d.find_element(By.ID, "audit").text  # type: ignore[attr-defined]
    for verb in ("token.create", "token.rotate", "token.revoke", "policy.apply", "approval.add"):
        assert verb in audit
    assert "admin (console)" in audit

    # a form posted without the CSRF token is refused, even with a valid session cookie
    cookies = {c["name"]: c["value"] for c in d.get_cookies()}  # type: ignore[attr-defined]
    refused = requests.post(hub.url + "/console/clusters", data={"name": "sneaky"}, cookies=cookies, timeout=5,
                            allow_redirects=False)
    assert refused.status_code == 400 and "CSRF" in refused.text
    listed = requests.get(hub.url + "/api/v1/admin/clusters", headers={"Authorization": f"Bearer {ADMIN}"},
                          timeout=5).json()["clusters"]
    assert [c["name"] for c in listed] == [NAME]
