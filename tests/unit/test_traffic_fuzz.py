"""schemathesis against the traffic routes of the OpenAPI document (`/v1/spillover/traffic`, tickets):
no 5xx and no hang for any body or header, with the real Traffic, board, dry-run and tiered dispatch
over the shared fakes (tests/unit/traffic_fixture.py). Only these paths: a fuzzed drain of every target
would make the generation routes answer a legitimate 503."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from tests.unit.traffic_fixture import TrafficWorld, traffic_config

world = TrafficWorld(traffic_config(), auth=True)
schema = schemathesis.openapi.from_asgi("/openapi.json", world.gateway()[0].app).include(
    path_regex="^/v1/spillover/(traffic|tickets)"
)


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_traffic_routes_never_answer_5xx(case: Any) -> None:
    case.headers = {**(case.headers or {}), "authorization": "Bearer sk-ops"}
    case.call_and_validate(checks=[not_a_server_error])
