"""The Streamlit app in a real browser: served on 127.0.0.1 over the sample warehouse, every tab shows
data, no console errors, a screenshot of each tab in tests/artifacts/."""

from __future__ import annotations

import os
import sys

import pytest
from browser import ROOT, free_port, page, screenshot, server

APP = ROOT / "dashboards" / "app.py"
# tab title -> text from the sample data that only shows once the tab's queries ran
TABS = {"Leaderboard": "6 runs", "Training curves": "G-collapse", "pass@k": "eval/trained",
        "Ablation": "grpo.lr=3e-5", "Per-problem diff": "fixed", "Probes": "rl-probe"}


@pytest.mark.slow
def test_dashboard_loads_every_tab_without_console_errors(sample_warehouse, tmp_path):
    port = free_port()
    env = {**os.environ, "RLVR_WAREHOUSE": str(sample_warehouse.db)}
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.address", "127.0.0.1", "--server.port",
           str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
           "--server.fileWatcherType", "none"]
    url = f"http://127.0.0.1:{port}"
    with server(cmd, f"{url}/_stcore/health", env=env, log=tmp_path / "streamlit.log"), page(height=1700) as (pg, errors):
        pg.goto(url)
        pg.get_by_text(TABS["Leaderboard"]).first.wait_for(timeout=60_000)
        best = pg.get_by_text("best").first.inner_text()
        assert "lr3e-5-s1" in best  # the sample's best run (highest greedy accuracy), from the leaderboard query
        for i, (tab, marker) in enumerate(TABS.items()):
            pg.get_by_role("tab", name=tab).click()
            panel = pg.get_by_role("tabpanel").filter(visible=True)
            # Tables are drawn on a canvas; their cells also exist as hidden accessible elements: attached.
            panel.get_by_text(marker).first.wait_for(state="attached", timeout=30_000)
            if tab != "Leaderboard":  # every other tab draws a chart from its query
                panel.locator("[data-testid='stVegaLiteChart'] canvas, [data-testid='stVegaLiteChart'] svg") \
                    .first.wait_for(timeout=30_000)
            pg.wait_for_timeout(800)  # let the charts finish drawing before the picture
            screenshot(pg, f"dashboard_{i}_{tab.lower().replace(' ', '_').replace('@', 'at').replace('-', '_')}.png")
        assert pg.locator("[data-testid='stException']").count() == 0
        assert errors == [], "\n".join(errors)
    log = (tmp_path / "streamlit.log").read_text()
    assert "Traceback" not in log, log
