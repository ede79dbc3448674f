"""`/dashboard`: a self-contained page (no external fetch), and in a real headless Chromium
(Debian's `chromium`, skipped when it is not installed) it loads without console messages,
shows the segments of a running pool, and its numbers change after puts.

`KVPOOL_DASHBOARD_SCREENSHOT=PATH` keeps the screenshot the browser test makes (how
docs/img/dashboard.png was made); otherwise it goes to the test's tmp_path.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

from kvpool import Store
from kvtest.ops_http import http_base
from kvtest.pool import Pool, PoolFactory, pool  # noqa: F401
from kvtest.procs import require_binary


def _http(p: Pool) -> str:
    return http_base(p.master)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _browse(browser: str, url: str, *extra: str) -> tuple[str, list[str]]:
    """The DOM after the page ran ~3 s of its timers, and the console lines it logged."""
    proc = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=3000",
            "--window-size=1400,1000",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return proc.stdout, console


def test_dashboard_is_one_self_contained_page(pool: PoolFactory) -> None:  # noqa: F811
    p = pool(nodes=1, segment_size="8MiB", master_args=("--http-port", "0"))
    with urllib.request.urlopen(_http(p) + "/dashboard", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/html")
        html = r.read().decode()
    for element in ("objects", "capacity", "used", "segments", "clients", "tenants", "ops-chart"):
        assert f'id="{element}"' in html
    # Nothing is fetched from elsewhere: no script/style/image source, no URL but the SVG
    # namespace (a name, never fetched).
    assert "src=" not in html
    urls = set(re.findall(r"https?://[^\s\"']+", html))
    assert urls <= {"http://www.w3.org/2000/svg"}
    assert "/api/v1/stats" in html and "/api/v1/tenants" in html


def test_dashboard_in_headless_chromium(pool: PoolFactory, tmp_path: Path) -> None:  # noqa: F811
    browser = _chromium() or require_binary("chromium")  # skips, or fails in CI without it
    p = pool(nodes=2, segment_size="16MiB", master_args=("--http-port", "0"))
    url = _http(p) + "/dashboard"
    dom, console = _browse(browser, url, "--dump-dom")
    assert console == [], console
    assert dom.count('class="segment"') == 2
    assert 'id="objects">0<' in dom
    with Store(p.address) as store:
        for i in range(50):
            store.put(f"dash-{i}", b"d" * 100_000)
        for i in range(50):
            store.get(f"dash-{i}")
        shot = Path(os.environ.get("KVPOOL_DASHBOARD_SCREENSHOT", tmp_path / "dashboard.png"))
        dom, console = _browse(browser, url, "--dump-dom")
        assert console == [], console
        assert 'id="objects">50<' in dom
        assert dom.count('class="segment"') == 2
        assert re.search(r'id="role"[^>]*>role: single<', dom), dom[:600]
        assert 'class="tenant"' in dom
        _, console = _browse(browser, url, f"--screenshot={shot.resolve()}")
        assert console == [], console
    assert shot.stat().st_size > 10_000
