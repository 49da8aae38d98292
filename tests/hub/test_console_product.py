"""The console as a product, in a real browser: headless Chromium (Debian's chromium + chromium-driver) via selenium,
against `kubeon-gpu hub serve`, with axe-core (npm) run inside every page.

Real: the browser, the hub process and its database, axe-core. The optimizer's side is played by the test over
HTTP with the controller's own client (controller.hubsync.HubClient) and its own summary code
(gpupolicy.capacity.summary.summarize over nodes and pods built as the API server returns them); faked: nothing else.
Screenshots at 1280 and 390 pixels wide are written under $KUBEON_ARTIFACTS (default /tmp/kubeon-artifacts)/hub-console;
with KUBEON_UPDATE_DOCS_IMAGES=1 they are copied into docs/images/ too (the ones docs/hub-console.md shows).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from controller.capacity.reconciler import DEFAULT_INSTANCES
from controller.hubsync import HubClient, HubSettings
from gpupolicy.capacity.instances import load_instances
from gpupolicy.capacity.layout import read_nodes
from gpupolicy.capacity.summary import AppliedSaving, GpuSample, idle_gpus, pending_gpu_pods, summarize
from tests.cluster.objects import make_node, make_pod
from tests.hub.browsing import click_through
from tests.hub.conftest import ADMIN, HubProcess, start_hub
from tests.hub.test_console_browser import CHROMIUM, DRIVER
from tests.loopback import wait_for
from tests.missing import missing

AXE = Path(os.environ.get("KUBEON_AXE_CORE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
           / "kubeon-gpu" / "npm" / "node_modules" / "axe-core" / "axe.min.js")
ARTIFACTS = Path(os.environ.get("KUBEON_ARTIFACTS") or Path(tempfile.gettempdir()) / "kubeon-artifacts") / "hub-console"
DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
WIDTHS = {"wide": (1280, 900), "phone": (390, 844)}
CATALOG = load_instances(str(DEFAULT_INSTANCES))
TARGET = "Deployment/inference/llm"


@pytest.fixture
def browser() -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        missing("chromium and chromium-driver are not installed: scripts/install-test-deps.sh installs them")
    if not AXE.is_file():
        missing(f"axe-core is not installed at {AXE}: scripts/install-test-deps.sh installs it from npm")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.implicitly_wait(5)
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    process = start_hub(f"sqlite:///{tmp_path}/hub.db")
    yield process
    process.stop()


class Optimizer:
    """What a cluster's optimizer sends, through the controller's own client and summary code."""

    def __init__(self, hub: HubProcess, cluster: str, token: str) -> None:
        self.hub, self.cluster, self.token = hub, cluster, token
        self.client = HubClient(HubSettings(hub.url, cluster, "unused"))
        self.sent = 0

    def poll(self) -> dict[str, Any]:
        answer = self.client.poll(self.token, None)
        assert answer.status == 200 and answer.body is not None, answer.error
        return answer.body

    def report(self, when: float, busy_gpus: int, idle_percent: dict[tuple[str, str], float],
               applied: list[AppliedSaving]) -> dict[str, Any]:
        """One summary: two g5.12xlarge nodes (4 A10G each), `busy_gpus` held on them, two pods waiting."""
        nodes = [make_node(f"a10-{n}", "NVIDIA-A10G", 4, instance_type="g5.12xlarge") for n in range(2)]
        pods = []
        for n in range(busy_gpus):
            pod = make_pod(f"w{n}", gpus=1)
            pod["spec"]["nodeName"], pod["status"] = f"a10-{n // 4}", {"phase": "Running"}
            pods.append(pod)
        for n in range(2):
            pod = make_pod(f"waiting-{n}", gpus=1)
            pod["status"] = {"phase": "Pending"}
            pods.append(pod)
        read = read_nodes(nodes, pods, {})
        samples = [GpuSample(node, gpu, value) for (node, gpu), value in idle_percent.items()]
        self.sent += 1
        summary = summarize(f"report-{self.sent}", when, read, pending_gpu_pods(pods), CATALOG,
                            idle_gpus(samples, read), applied)
        assert self.client.post_summaries(self.token, f"key-{self.sent}", [summary]) == 200
        return summary

    def propose(self, gpu_hours_per_month: float) -> None:
        action = {"id": "p-1", "policy": "llm-sharing", "target": TARGET,
                  "action": "nvidia.com/gpu=1 → nvidia.com/gpu.shared (time-slicing, 4 per GPU)", "mode": "Approve",
                  "result": "proposed", "time": time.time(), "estimatedGpuHoursPerMonth": gpu_hours_per_month}
        assert self.client.post_actions(self.token, "proposal", [action]) == 200

    def applied(self) -> None:
        action = {"id": "a-1", "policy": "llm-sharing", "target": TARGET,
                  "action": "nvidia.com/gpu=1 → nvidia.com/gpu.shared (time-slicing, 4 per GPU)", "mode": "Approve",
                  "result": "applied", "time": time.time()}
        assert self.client.post_actions(self.token, "applied", [action]) == 200


def _token(hub: HubProcess, cluster: str) -> str:
    done = hub.cli("token", "create", "--cluster", cluster)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _width(driver: Any, name: str) -> None:
    """The viewport `name` names, in CSS pixels (not a phone's emulated zoom, which would hide a page wider
    than the screen by zooming out)."""
    width, height = WIDTHS[name]
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})


def _check_page(driver: Any, page: str, width: str) -> None:
    """axe-core in the page: no serious or critical violation; at 390 px nothing wider than the screen."""
    driver.execute_script(AXE.read_text(encoding="utf-8"))
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']}).then(r => done(JSON.stringify(r.violations)),"
        " e => done(JSON.stringify([{id: 'axe-error', impact: 'critical', help: String(e), nodes: []}])));")
    violations = [v for v in json.loads(result) if v.get("impact") in ("serious", "critical")]
    found = [f"{v['id']} ({v['impact']}): {v['help']} at {[n.get('target') for n in v['nodes']][:3]}"
             for v in violations]
    assert not found, f"{page} at {width}: {found}"
    overflow = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    wide = driver.execute_script(
        "return [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right >"
        " window.innerWidth && !e.parentElement.closest('.table-wrap')).slice(0, 5)"
        ".map(e => e.tagName + '.' + e.className)")
    assert overflow <= 0, f"{page} at {width}: the page is {overflow}px wider than the screen: {wide}"


def _shoot(driver: Any, page: str, width: str) -> None:
    """A full-page screenshot, kept as a test artifact (and copied into docs/images when asked)."""
    w, h = WIDTHS[width]
    full = max(h, int(driver.execute_script("return document.documentElement.scrollHeight")))
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": w, "height": full, "deviceScaleFactor": 1, "mobile": False})
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"hub-console-{page}-{w}.png"
    assert driver.save_screenshot(str(path)), path
    if os.environ.get("KUBEON_UPDATE_DOCS_IMAGES") == "1":
        shutil.copyfile(path, DOCS_IMAGES / path.name)
    _width(driver, width)


def _every_width(driver: Any, page: str, shoot: bool = True) -> None:
    for width in WIDTHS:
        _width(driver, width)
        driver.refresh()
        _check_page(driver, page, width)
        if shoot:
            _shoot(driver, page, width)
    _width(driver, "wide")


def _figure(driver: Any, name: str, scope: str = "#figures") -> str:
    from selenium.webdriver.common.by import By

    text: str = driver.find_element(By.CSS_SELECTOR, f"{scope} [data-figure='{name}']").text
    return text


def _saved_this_month(hub: HubProcess) -> float:
    answer = requests.get(f"{hub.url}/api/v1/admin/clusters/prod/summaries", timeout=5,
                          headers={"Authorization": f"Bearer {ADMIN}"})
    return float(answer.json()["savedThisMonth"])


def test_a_platform_engineer_sees_gpus_and_money_and_approves(browser: Any, hub: HubProcess) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    token = _token(hub, "prod")
    admin = hub.client()
    assert admin.admin("PUT", "/clusters/prod/policies/llm-sharing", json={"spec": {
        "mode": "Approve", "selector": {"namespaces": ["inference"]}, "sharing": {"strategy": "TimeSlicing"}}}).ok
    optimizer = Optimizer(hub, "prod", token)
    optimizer.poll()
    start = time.time()
    busy = {("a10-0", str(g)): 90.0 for g in range(3)} | {("a10-0", "3"): 0.0} | {
        ("a10-1", str(g)): 0.0 for g in range(4)}
    first = optimizer.report(start - 600, 3, busy, [])
    optimizer.propose(gpu_hours_per_month=7300.0)
    _token(hub, "staging")
    assert hub.cli("token", "revoke", "--cluster", "staging").returncode == 0  # a cluster that stands out

    _width(d, "wide")
    d.get(hub.url + "/console/sign-in")
    _check_page(d, "sign-in", "wide")
    _width(d, "phone")
    _check_page(d, "sign-in", "phone")
    _shoot(d, "sign-in", "phone")
    _width(d, "wide")
    d.find_element(By.ID, "credential").send_keys(ADMIN)
    click_through(d, By.CSS_SELECTOR, "main button[type=submit]")
    wait_for(lambda: d.current_url.endswith("/console/"), what="sign-in to lead to the clusters")

    # the overview: each cluster's state, GPUs, allocated %, idle, cost per hour, savings this month
    row = "tr[data-cluster='prod']"
    assert first["gpus"] == 8 and first["allocatedGpus"] == 3 and first["idleGpus"] == 5
    assert _figure(d, "gpus", row) == "8"
    assert _figure(d, "allocated", row) == "3 (38 %)"
    assert _figure(d, "idle", row) == "5"
    assert _figure(d, "cost", row) == "$11.34"
    assert _figure(d, "saved", row) == "$0.00"
    assert d.find_element(By.CSS_SELECTOR, "tr[data-cluster='staging']").get_attribute("class") == "alert"
    assert d.find_element(By.CSS_SELECTOR, "tr[data-cluster='staging'] td[data-state]").text == "disconnected"
    _every_width(d, "clusters")

    # the cluster page: figures, charts, the proposal with its estimated saving, one-click approval
    click_through(d, By.LINK_TEXT, "prod")
    assert _figure(d, "gpus") == "8" and _figure(d, "idle") == "5" and _figure(d, "pending") == "2"
    assert _figure(d, "cost") == "$11.34"
    assert d.find_element(By.CSS_SELECTOR, "#by-model tbody td").text == "NVIDIA-A10G"
    assert "Now: GPUs 8; Allocated 3; Idle (DCGM) 5." in d.find_element(By.CSS_SELECTOR, "#chart-gpus desc") \
        .get_attribute("textContent")
    saving = d.find_element(By.CSS_SELECTOR, "#proposals [data-figure='saving']").text
    assert saving.startswith(f"${7300 * first['pricePerGpuHour']:,.2f}/month"), saving
    _check_page(d, "cluster", "wide")
    _shoot(d, "proposal", "wide")
    click_through(d, By.CSS_SELECTOR, f"button[aria-label='Approve {TARGET}']")
    wait_for(lambda: [(a["policy"], a["target"]) for a in optimizer.poll()["approvals"]] == [("llm-sharing", TARGET)],
             what="the approval to reach the optimizer's next poll")
    assert d.find_element(By.CSS_SELECTOR, f"button[aria-label='Withdraw approval of {TARGET}']")

    # the optimizer applies it and reports again: the figures change
    optimizer.applied()
    second = optimizer.report(time.time() - 300, 6, {("a10-1", "2"): 0.0, ("a10-1", "3"): 0.0},
                              [AppliedSaving("llm-sharing", TARGET, 7300.0)])
    assert second["savings"]["perHour"] == pytest.approx(10 * second["pricePerGpuHour"], abs=1e-3)
    before = _saved_this_month(hub)
    d.refresh()
    after = _saved_this_month(hub)
    assert _figure(d, "allocated") == "6 (75 %)" and _figure(d, "idle") == "2"
    assert before > 1.0, "about 5 minutes at $14/h"
    assert before <= float(_figure(d, "saved").lstrip("$")) <= after, "the API's figure, as it grows by the second"
    savings_chart = d.find_element(By.CSS_SELECTOR, "#chart-savings desc").get_attribute("textContent")
    assert "Saved per hour $14.18" in savings_chart
    assert "applied" in d.find_element(By.ID, "actions").text
    _every_width(d, "cluster")
    click_through(d, By.LINK_TEXT, "Last 7 days")  # the charts' range: 24 hours unless asked
    assert d.find_element(By.CSS_SELECTOR, "a[aria-current=true]").text == "Last 7 days"
    assert "Now: GPUs 8; Allocated 6; Idle (DCGM) 2." in d.find_element(By.CSS_SELECTOR, "#chart-gpus desc") \
        .get_attribute("textContent")
    d.get(hub.url + "/console/clusters/prod?range=1y")
    assert "range '1y': one of 24h, 7d, 30d" in d.find_element(By.CSS_SELECTOR, "[role=alert]").text
    _check_page(d, "error", "wide")
    d.get(hub.url + "/console/clusters/prod")

    # the other pages: a new policy, the audit log, a confirmation, a token shown once
    click_through(d, By.LINK_TEXT, "Add policy")
    _every_width(d, "policy", shoot=False)
    click_through(d, By.LINK_TEXT, "Audit log")
    assert "approval.add" in d.find_element(By.ID, "audit").text
    _every_width(d, "audit", shoot=False)
    d.get(hub.url + "/console/clusters/prod/rotate")
    _every_width(d, "confirm", shoot=False)
    click_through(d, By.LINK_TEXT, "Clusters")
    d.find_element(By.ID, "name").send_keys("edge")
    click_through(d, By.XPATH, "//button[text()='Add cluster']")
    shown = d.find_element(By.ID, "token").text
    assert shown.startswith("kgo_")
    assert f"--from-literal=token='{shown}'" in d.find_element(By.ID, "secret-command").text
    label = d.find_element(By.CSS_SELECTOR, "label[for=token]").rect
    box = d.find_element(By.ID, "token").rect
    assert label["y"] + label["height"] <= box["y"], "the label stands above the token, not under it"
    assert requests.post(f"{hub.url}/console/clusters", timeout=5).status_code == 400  # CSRF, as before
    _check_page(d, "token", "wide")
    _width(d, "phone")
    _check_page(d, "token", "phone")
    _width(d, "wide")
