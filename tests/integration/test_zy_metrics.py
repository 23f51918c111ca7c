"""After the session's real requests (local, burst, waits, contracts), `/metrics` has data for
every metric the Grafana dashboard queries."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.integration.conftest import REPO, Stack

pytestmark = pytest.mark.integration
METRIC = re.compile(r"\b(spillover_[a-z_]+)\b")


def test_every_dashboard_metric_has_data(stack: Stack) -> None:
    scrape = httpx.get(f"{stack.base_url}/metrics", timeout=10)
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
    with_data = {line.split("{")[0].split(" ")[0] for line in scrape.text.splitlines() if not line.startswith("#")}
    dashboard = json.loads((REPO / "cluster/grafana-dashboard.json").read_text())
    queried = {m for panel in dashboard["panels"] for t in panel["targets"] for m in METRIC.findall(t["expr"])}
    assert queried - with_data == set()
    assert 'route="cloud"' in scrape.text and 'route="local"' in scrape.text
