"""The target's pages in a real browser: Debian's chromium and chromedriver, driven by Selenium, against a
real `specmarket target` process with two real drafter peers (an honest one, and a garbage one that
the market benches). One target, one browser for the whole module.

Screenshots go to tests/artifacts/ (ignored by git) and, when SPECMARKET_SCREENSHOTS names a folder
(``make screenshots`` uses docs/img), there too, for the README.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import math
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from node.lab.procs import ProcessGroup
from node.target.http.pages import write_simulator
from tests.netutil import complete, http_json, start_drafter, start_target, wait_for_drafters
from verifier.theory import expected_tokens, optimal_gamma, speedup

pytestmark = pytest.mark.slow(seconds=30)  # scheduled first (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
DESKTOP = (1280, 900)
PHONE_WIDTH = 375
WAIT_S = 20.0
DEADLINE = ("--draft-deadline-ms", "1000")  # CI machines are slow; benching garbage needs errors, not timeouts
CHROME_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@dataclass
class Net:
    http: str
    honest: str  # peer ids
    garbage: str


def require_browser() -> None:
    """Skip without chromium, chromedriver or selenium; on CI (``make test`` installs them) fail."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
    if missing:
        message = f"the browser tests need {', '.join(missing)} (`make test` installs them)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Any]:
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()  # with both paths given, Selenium Manager never runs (nor downloads)
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROME_FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_window_size(*DESKTOP)
    try:
        yield driver
    finally:
        driver.quit()


def peer_id(node) -> str:
    return node.lines["multiaddr"][0].rsplit("/", 1)[-1]


@pytest.fixture(scope="module")
def net(tmp_path_factory) -> Iterator[Net]:
    tmp = tmp_path_factory.mktemp("pages")
    with ProcessGroup() as group:
        target = start_target(tmp, *DEADLINE, group=group)
        boot, http = target.lines["multiaddr"][0], target.lines["http"][0]
        assert target.lines["dashboard"] == [f"{http}/"]  # the target prints where its dashboard is
        honest, garbage = group.start_all([partial(start_drafter, tmp, boot, s, s) for s in ("honest", "garbage")])
        wait_for_drafters(http, 2)
        yield Net(http, peer_id(honest), peer_id(garbage))
        assert target.stop() == 0, target.log()[-3000:]


# ---- helpers ------------------------------------------------------------------------------------


def wait_for(driver, condition: Callable[[Any], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, timeout_s, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,))
    try:
        return wait.until(condition)
    except TimeoutException:
        raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}") from None


def css(driver, selector: str) -> list:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def value_of(driver, element_id: str) -> float | None:
    raw = driver.execute_script("return document.getElementById(arguments[0]).getAttribute('data-value')", element_id)
    return None if raw in (None, "") else float(raw)


# the dashboard rebuilds its rows every second: a row is read in one script, never element by element
ROW_JS = """
const row = [...document.querySelectorAll("tr[data-peer]")].find((r) => r.dataset.peer === arguments[0]);
if (!row) return null;
const cells = {};
for (const td of row.querySelectorAll("td[data-field]")) cells[td.dataset.field] = [td.textContent, td.title];
return {benched: row.dataset.benched, cells: cells};
"""


def drafter_row(driver, peer: str) -> dict | None:
    """{benched: "true"|"false", cells: {field: [text, title]}} of the drafter's row, or None."""
    return driver.execute_script(ROW_JS, peer)


def count(text: str) -> int:
    digits = text.replace(",", "")
    return int(digits) if digits.isdigit() else -1


def console_errors(driver) -> list[dict]:
    """The SEVERE entries of the browser's console since the last call (reading empties it)."""
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def screenshot(driver, name: str) -> list[Path]:
    """The whole page (a viewport as tall as the page) to tests/artifacts/ and SPECMARKET_SCREENSHOTS."""
    folders = [ARTIFACTS]
    if wanted := os.environ.get("SPECMARKET_SCREENSHOTS"):
        folders.append(Path(wanted) if Path(wanted).is_absolute() else ROOT / wanted)
    width, height = driver.execute_script("return [window.innerWidth, document.documentElement.scrollHeight]")
    metrics = {"width": width, "height": min(int(height), 4000), "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    paths = []
    try:
        driver.execute_async_script("requestAnimationFrame(() => requestAnimationFrame(arguments[0]))")
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            assert driver.save_screenshot(str(folder / name)), folder / name
            paths.append(folder / name)
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    return paths


def set_param(driver, name: str, value: float) -> None:
    """Move a slider as the page sees a user move it: a new value, then an input event."""
    driver.execute_script(
        "const el = document.getElementById(arguments[0]); el.value = String(arguments[1]);"
        "el.dispatchEvent(new Event('input', {bubbles: true}));",
        name,
        value,
    )


def garbage_benched(net: Net) -> bool:
    row = http_json(f"{net.http}/api/dashboard")["drafters"].get(net.garbage) or {}
    return bool(row.get("benched"))


# ---- the routes ---------------------------------------------------------------------------------


@contextlib.contextmanager
def static_site(folder: Path) -> Iterator[str]:
    """``folder`` served over HTTP on loopback (as a report folder would be); its base URL."""
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def fetch(url: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_pages_and_their_files_are_served_read_only(net):
    for path, kind in (("/", "text/html"), ("/simulator", "text/html"), ("/static/style.css", "text/css")):
        status, headers, body = fetch(f"{net.http}{path}")
        assert status == 200 and headers["content-type"].startswith(kind), (path, status, headers)
        assert headers["cache-control"] == "no-cache" and headers["x-content-type-options"] == "nosniff"
    status, headers, body = fetch(f"{net.http}/static/dashboard.js")
    assert headers["content-type"].startswith("text/javascript") and b"/api/dashboard" in body
    assert "script-src 'self'" in fetch(f"{net.http}/")[1]["content-security-policy"]
    for name in ("__init__.py", "..%2Fapi.py", "%2E%2E", "nope.js", "style.css%00", ".%2Fstyle.css"):
        assert fetch(f"{net.http}/static/{name}")[0] == 404, name
    assert fetch(f"{net.http}/static/style.css/x")[0] == 404
    assert fetch(f"{net.http}/", method="POST")[0] == 405


# ---- the dashboard ------------------------------------------------------------------------------


def test_dashboard_lists_drafters_and_follows_the_node_without_a_reload(browser, net):
    driver = browser
    driver.get(f"{net.http}/")
    for peer in (net.honest, net.garbage):
        wait_for(driver, lambda d, p=peer: drafter_row(d, p), f"the row of drafter {peer}")
    text, title = drafter_row(driver, net.honest)["cells"]["peer"]
    assert title == net.honest and text != net.honest and text[:8] == net.honest[:8]  # shortened, full in title
    requests_before = value_of(driver, "requests")
    assert requests_before is not None
    driver.execute_script("window.sameDocument = true")

    polls = lambda d: int(d.execute_script("return document.body.dataset.polls || 0"))  # noqa: E731
    wait_for(driver, lambda d: polls(d) >= 3, "three polls before the first completion")
    for seed in range(8):  # garbage drafts are errors: two in a row bench it; spaced, for the time series
        complete(net.http, "def parse(self, text):\n", seed=seed, max_tokens=24)
        if seed >= 3 and garbage_benched(net):
            break
        time.sleep(0.5)
    assert garbage_benched(net), http_json(f"{net.http}/api/dashboard")["drafters"]

    wait_for(driver, lambda d: (value_of(d, "requests") or 0) > requests_before, "#requests to count the completions")
    wait_for(driver, lambda d: css(d, "#jobs tbody tr[data-job]"), "a finished job in #jobs")
    benched = wait_for(
        driver, lambda d: (r := drafter_row(d, net.garbage)) and r["benched"] == "true" and r, "garbage benched"
    )
    assert "benched for" in benched["cells"]["state"][0]
    honest_proposed = lambda d: count(drafter_row(d, net.honest)["cells"]["proposed"][0]) > 0  # noqa: E731
    wait_for(driver, honest_proposed, "the honest drafter's proposed tokens")
    wait_for(driver, lambda d: int(css(d, "#series-tps")[0].get_attribute("data-points") or 0) >= 2, "the series")
    assert driver.execute_script("return window.sameDocument") is True, "the page reloaded"
    assert css(driver, "#status")[0].get_attribute("data-status") == "ok"
    assert css(driver, "#conn")[0].get_attribute("data-state") == "live"
    screenshot(driver, "dashboard.png")
    assert console_errors(driver) == []


def test_dashboard_says_when_the_node_is_unreachable(browser, net):
    driver = browser
    driver.get(f"{net.http}/")
    wait_for(driver, lambda d: drafter_row(d, net.honest), "the dashboard's first answer")
    console_errors(driver)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/api/dashboard*"]})
    try:
        wait_for(driver, lambda d: css(d, '#conn[data-state="unreachable"]'), "the unreachable badge")
        assert "node unreachable" in css(driver, "#conn")[0].text
        assert drafter_row(driver, net.honest), "the last answer should stay on the page"
    finally:
        driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
    wait_for(driver, lambda d: css(d, '#conn[data-state="live"]'), "the page to recover")
    console_errors(driver)  # the blocked fetches were logged as errors; drop them


HOSTILE = '<img src=x onerror="window.pwned = 1">&amp;'


def hostile_view(http: str) -> dict:
    """The node's real answer with attacker-chosen strings where peers choose them, and an operator."""
    view = http_json(f"{http}/api/dashboard")
    row = {**next(iter(view["drafters"].values())), "last_error": HOSTILE, "benched": True, "bench_reason": HOSTILE}
    challenge = {"id": 7, "operator": "0x1", "challenger": HOSTILE, "position": 3, "state": "open"}
    challenge |= {"opened_at": 1_790_000_000, "deadline": 1_790_003_600, "bond_wei": 10**17}
    operator = {"address": "0xabc", "contract": HOSTILE, "chain_id": 31337, "bond_wei": 15 * 10**17, "active": True}
    operator |= {"unbonding": False, "unbond_at": 0, "chain_reachable": False, "serving": False, "reason": HOSTILE}
    operator |= {"receipts_signed": 12, "challenges": [challenge]}
    jobs = [{**view["jobs"][0], "job": HOSTILE}] if view["jobs"] else []
    hostile = {"status": "unavailable", "reason": HOSTILE, "model": HOSTILE, "peer_id": HOSTILE}
    hostile |= {"multiaddrs": [HOSTILE], "drafters": {HOSTILE: row}, "jobs": jobs, "operator": operator}
    return {**view, **hostile}


def test_dashboard_shows_the_nodes_strings_as_text_and_the_operator(browser, net):
    driver = browser
    driver.get(f"{net.http}/")
    wait_for(driver, lambda d: drafter_row(d, net.honest), "the dashboard's first answer")
    stub = "const data = arguments[0]; window.fetch = async () => new Response(JSON.stringify(data));"
    driver.execute_script(stub, hostile_view(net.http))
    wait_for(driver, lambda d: css(d, '#status[data-status="unavailable"]'), "the stubbed answer")
    assert css(driver, "#reason")[0].text == HOSTILE and css(driver, "#model")[0].text == HOSTILE
    row = driver.execute_script("return [...document.querySelectorAll('tr[data-peer]')].map(r => r.dataset.peer)")
    assert row == [HOSTILE]
    assert drafter_row(driver, HOSTILE)["cells"]["last_error"][0] == HOSTILE
    assert css(driver, "img") == [] and driver.execute_script("return window.pwned") is None
    assert css(driver, "#op-bond")[0].text == "1.5 ETH" and css(driver, "#op-receipts")[0].text == "12"
    assert css(driver, "#op-chain-reachable")[0].text == "no" and HOSTILE in css(driver, "#op-serving")[0].text
    challenge = css(driver, '#challenges tr[data-challenge="7"][data-state="open"]')
    assert challenge and "0.1 ETH" in challenge[0].text
    assert console_errors(driver) == []


def test_pages_fit_a_phone_width(browser, net):
    driver = browser
    metrics = {"width": PHONE_WIDTH, "height": 800, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        for path, ready in (("/", "body[data-polls]"), ("/simulator", 'body[data-ready="true"]')):
            driver.get(f"{net.http}{path}")
            wait_for(driver, lambda d, r=ready: css(d, r), f"{path} to be ready")
            inner, page, body = driver.execute_script(
                "return [window.innerWidth, document.documentElement.scrollWidth, document.body.scrollWidth]"
            )
            assert inner == PHONE_WIDTH
            assert page <= PHONE_WIDTH and body <= PHONE_WIDTH, f"{path} overflows a phone: {page} px, {body} px"
            name = "phone-dashboard.png" if path == "/" else "phone-simulator.png"
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(ARTIFACTS / name))
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    assert console_errors(driver) == []


# ---- the simulator ------------------------------------------------------------------------------


def test_simulator_speedup_and_optimum_follow_theory(browser, net):
    from selenium.webdriver.common.keys import Keys

    driver = browser
    driver.get(f"{net.http}/simulator")
    wait_for(driver, lambda d: css(d, 'body[data-ready="true"]'), "the simulator")
    alpha, cost = 0.8, 0.05
    set_param(driver, "alpha", alpha)
    set_param(driver, "cost", cost)
    assert value_of(driver, "speedup") == pytest.approx(speedup(alpha, 4, cost), abs=1e-12)
    css(driver, "#gamma")[0].send_keys(Keys.ARROW_RIGHT)  # γ 4 -> 5, by the keyboard
    assert css(driver, "#gamma")[0].get_attribute("value") == "5"
    assert value_of(driver, "speedup") == pytest.approx(speedup(alpha, 5, cost), abs=1e-12)
    assert value_of(driver, "omega") == pytest.approx(expected_tokens(alpha, 5), abs=1e-12)

    seen = set()
    for alpha, cost in ((0.8, 0.05), (0.5, 0.05), (0.8, 0.3), (0.95, 0.01)):
        set_param(driver, "alpha", alpha)
        set_param(driver, "cost", cost)
        marker = css(driver, "#opt-marker")[0]
        assert int(marker.get_attribute("data-gamma")) == optimal_gamma(alpha, cost, max_gamma=16), (alpha, cost)
        assert value_of(driver, "opt-gamma") == optimal_gamma(alpha, cost, max_gamma=16)
        seen.add(int(marker.get_attribute("data-gamma")))
    assert len(seen) >= 3, f"the optimum should have moved: {seen}"
    js = driver.execute_script("return [SpecTheory.expectedTokens(0.3, 7), SpecTheory.optimalGamma(0.9, 0.02, 16)]")
    assert js[0] == pytest.approx(expected_tokens(0.3, 7), abs=1e-12) and js[1] == optimal_gamma(0.9, 0.02, 16)
    assert console_errors(driver) == []


def test_simulator_steps_and_plays_rounds(browser, net):
    driver = browser
    driver.get(f"{net.http}/simulator")
    wait_for(driver, lambda d: css(d, 'body[data-ready="true"]'), "the simulator")
    alpha, gamma = 0.7, 4
    set_param(driver, "alpha", alpha)
    step = css(driver, "#step")[0]
    for n in range(1, 6):
        step.click()
        assert value_of(driver, "rounds") == n
        draws = css(driver, "#draws")[0]
        assert len(css(draws, ".draw")) == gamma + 1  # γ draws and the target's own token
        accepted = int(draws.get_attribute("data-accepted"))
        assert len(css(draws, '.draw[data-outcome="accept"]')) == accepted
        assert value_of(driver, "running-mean") == pytest.approx(value_of(driver, "sim-tokens") / n)

    driver.execute_script("document.getElementById('speed').value = '1000'")
    css(driver, "#play")[0].click()
    wait_for(driver, lambda d: (value_of(d, "rounds") or 0) >= 3000, "3000 played rounds", timeout_s=60)
    css(driver, "#play")[0].click()
    paused_at = value_of(driver, "rounds")
    time.sleep(0.3)
    assert value_of(driver, "rounds") == paused_at, "pause did not stop the rounds"
    mean = value_of(driver, "running-mean")
    assert mean == pytest.approx(value_of(driver, "sim-tokens") / paused_at)
    assert abs(mean - expected_tokens(alpha, gamma)) < 6 * (gamma + 1) / math.sqrt(paused_at)
    assert console_errors(driver) == []


def test_simulator_takes_measurements_embedded_by_url_and_from_a_file(browser, net, tmp_path):
    driver = browser
    demo = json.loads((ROOT / "report" / "demo_net.json").read_text())
    fit = demo["derived"]["fit"]
    page = write_simulator(tmp_path / "report", demo)  # (a) embedded, the page opened from disk
    driver.get(page.as_uri())
    wait_for(driver, lambda d: css(d, '#measured-status[data-state="loaded"]'), "the embedded measurement")
    shown = driver.execute_script("const p = SpecSimulator.params; return [p.alpha, p.cost, p.verify, p.gamma]")
    assert shown == [fit["alpha"], fit["cost"], fit["verify_cost"], fit["gamma"]]
    points = [p for p in demo["local_sweep"] if 1 <= p["gamma"] <= 16]
    assert len(css(driver, "rect.measured")) == len(points)  # the local sweep
    assert len(css(driver, "path.measured")) == 1  # the networked run
    scores = [speedup(fit["alpha"], g, fit["cost"], fit["verify_cost"]) for g in range(1, 17)]
    assert int(css(driver, "#opt-marker")[0].get_attribute("data-gamma")) == 1 + scores.index(max(scores))
    for _ in range(12):
        css(driver, "#step")[0].click()
    assert value_of(driver, "rounds") == 12
    screenshot(driver, "simulator.png")
    assert console_errors(driver) == []

    bench = {"temperature": 0.8, "bound": {"alpha": 0.61, "c": 0.08, "v": 1.15, "bound": 1.7}}
    served = tmp_path / "served"  # (b) ?measured=<a path on the same site>: a report folder served
    write_simulator(served)
    (served / "bench.json").write_text(json.dumps(bench))
    with static_site(served) as site:
        driver.get(f"{site}/simulator.html?measured=bench.json")
        wait_for(driver, lambda d: css(d, '#measured-status[data-state="loaded"]'), "the measurement from the URL")
        assert driver.execute_script("const p = SpecSimulator.params; return [p.alpha, p.cost, p.verify]") == [
            0.61,
            0.08,
            1.15,
        ]
        data_url = "data:application/json," + urllib.parse.quote(json.dumps(bench))
        for elsewhere in (data_url, f"{site}/bench.json"):  # another origin than the node's: refused unfetched
            driver.get(f"{net.http}/simulator?measured={urllib.parse.quote(elsewhere, safe='')}")
            wait_for(driver, lambda d: css(d, '#measured-status[data-state="error"]'), "the refusal")
            assert "only a path on this site" in css(driver, "#measured-status")[0].text
            assert driver.execute_script("return SpecSimulator.measured()") is None

    picked = tmp_path / "bench.json"  # (c) the file picker
    picked.write_text(json.dumps({"bound": {"alpha": 0.42, "c": 0.2, "v": 1.0}}))
    css(driver, "#measured-file")[0].send_keys(str(picked))
    wait_for(driver, lambda d: "bench.json" in css(d, "#measured-status")[0].text, "the picked file")
    assert driver.execute_script("return SpecSimulator.params.alpha") == 0.42
    assert console_errors(driver) == []
