"""Headless Chromium (Debian's `chromium`) driven by Playwright, collecting console errors; loopback servers."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from rlvr_core.core.net import free_port  # noqa: F401 (the tests import it from here)

ROOT = Path(__file__).resolve().parents[2]
# Screenshots for people to look at; tests/artifacts/ is not tracked (RLVR_TEST_ARTIFACTS moves it).
ARTIFACTS = Path(os.environ.get("RLVR_TEST_ARTIFACTS", ROOT / "tests" / "artifacts"))
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def chromium_path() -> str:
    exe = os.environ.get("RLVR_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        pytest.fail("Debian's chromium is not installed (apt-get install -y chromium); the dashboard tests load "
                    "pages in a real browser")
    return exe


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server for {url} exited with {proc.returncode} at start-up")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"{url} did not answer within {timeout_s:.0f} s")


@contextlib.contextmanager
def server(cmd: list[str], ready_url: str, env: dict | None = None, log: Path | None = None) -> Iterator[None]:
    out = open(log, "w") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_http(ready_url, proc)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            out.close()


@contextlib.contextmanager
def page(width: int = 1400, height: int = 1000):
    """A Chromium page; yields (page, errors) where errors collects console errors and uncaught exceptions."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as pw:
        # Playwright gives every launch a fresh temporary profile (it refuses --user-data-dir in args).
        browser = pw.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_FLAGS)
        try:
            pg = browser.new_page(viewport={"width": width, "height": height})
            pg.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
            pg.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
            pg.on("requestfailed", lambda r: errors.append(f"request failed: {r.url} {r.failure}"))
            yield pg, errors
        finally:
            browser.close()


def screenshot(pg, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    dest = ARTIFACTS / name
    pg.screenshot(path=str(dest), full_page=True)
    return dest
