"""Console sessions against a real `kubeon-gpu hub serve` (gunicorn, two workers, SQLite): what a copied
cookie can do after sign-out, what a cookie says about the admin credential, what pages may be cached.

Real: the hub process and its database, HTTP with `requests`. Faked: nothing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from flask import Flask
from flask.sessions import SecureCookieSessionInterface

from tests.hub.conftest import ADMIN, HubProcess, start_hub


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    process = start_hub(f"sqlite:///{tmp_path}/hub.db")
    yield process
    process.stop()


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found, page[:500]
    return found.group(1)


def _signed_in(hub: HubProcess) -> requests.Session:
    browser = requests.Session()
    page = browser.get(f"{hub.url}/console/sign-in", timeout=5)
    answer = browser.post(f"{hub.url}/console/sign-in", data={"credential": ADMIN, "csrf_token": _csrf(page.text)},
                          timeout=5, allow_redirects=False)
    assert answer.status_code == 302
    return browser


def test_sign_out_ends_the_session_a_copied_cookie_included(hub: HubProcess) -> None:
    """The session was only a signed cookie: after sign-out a copy of it still read and changed everything
    for 31 days, on every worker."""
    browser = _signed_in(hub)
    page = browser.get(f"{hub.url}/console/", timeout=5)
    assert page.status_code == 200 and "sign-in" not in page.url
    copied = requests.Session()
    copied.cookies.update(browser.cookies)
    csrf = _csrf(page.text)
    assert browser.post(f"{hub.url}/console/sign-out", data={"csrf_token": csrf}, timeout=5,
                        allow_redirects=False).status_code == 302
    for _ in range(4):  # whichever worker answers
        again = copied.get(f"{hub.url}/console/", timeout=5, allow_redirects=False)
        assert again.status_code == 302 and "/console/sign-in" in again.headers["Location"]
        refused = copied.post(f"{hub.url}/console/clusters", data={"name": "sneaky", "csrf_token": csrf},
                              timeout=5, allow_redirects=False)
        assert refused.status_code in (302, 400)
    assert "sneaky" not in [c["name"] for c in hub.client().admin("GET", "/clusters").json()["clusters"]]
    entries = [e["verb"] for e in hub.client().admin("GET", "/audit").json()["entries"]]
    assert "console sign-in" in entries and "console sign-out" in entries


def test_a_cookie_says_nothing_of_the_admin_credential(hub: HubProcess) -> None:
    """The cookie's key was sha256 of the admin credential: any visitor's cookie let them test guesses of it
    offline. The key is random now; the credential itself no longer opens the cookie."""
    cookie = requests.get(f"{hub.url}/console/sign-in", timeout=5).cookies.get("session")
    assert cookie
    app = Flask(__name__)
    app.secret_key = hashlib.sha256(b"kubeon-hub-session\x00" + ADMIN.encode()).hexdigest()
    serializer = SecureCookieSessionInterface().get_signing_serializer(app)
    assert serializer is not None
    with pytest.raises(Exception, match="Signature"):
        serializer.loads(cookie)


def test_console_pages_are_never_cached(hub: HubProcess) -> None:
    """A new cluster's token is shown once, on a console page: no browser cache or history may keep it."""
    browser = _signed_in(hub)
    page = browser.get(f"{hub.url}/console/", timeout=5)
    token_page = browser.post(f"{hub.url}/console/clusters", data={"name": "c1", "csrf_token": _csrf(page.text)},
                              timeout=5)
    assert token_page.status_code == 200 and "kgo_" in token_page.text
    assert token_page.headers["Cache-Control"] == "no-store"
    assert browser.get(f"{hub.url}/console/sign-in", timeout=5).headers["Cache-Control"] == "no-store"


def test_failed_sign_ins_are_throttled_per_client_and_audited(hub: HubProcess) -> None:
    """Fifty wrong credentials in a row were fifty 401s, with no delay and no trace: an admin credential a
    person chose could be guessed online. Ten failures a minute per address, then 429; each is audited."""
    browser = requests.Session()
    csrf = _csrf(browser.get(f"{hub.url}/console/sign-in", timeout=5).text)
    codes = [browser.post(f"{hub.url}/console/sign-in", data={"credential": f"guess-{n}", "csrf_token": csrf},
                          timeout=5).status_code for n in range(12)]
    assert codes == [401] * 10 + [429] * 2
    right = browser.post(f"{hub.url}/console/sign-in", data={"credential": ADMIN, "csrf_token": csrf}, timeout=5,
                         allow_redirects=False)
    assert right.status_code == 429, "the right credential waits too, or guessing could go on"
    entries = [e for e in hub.client().admin("GET", "/audit").json()["entries"]
               if e["verb"] == "console sign-in failed"]
    assert len(entries) == 10 and entries[0]["actor"] == "console (127.0.0.1)"
