"""The `sessions` config section and a scenario's `switch`: bad values name the field and never start anything."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.config.deployment import parse_config
from router.errors import ConfigError

MODEL = {"alias": "m", "source": "prepared:x", "family": "llama"}


def _config(**sections: Any) -> Any:
    return parse_config({"models": [MODEL], **sections}, "test")


def test_defaults() -> None:
    sessions = _config().sessions
    assert sessions.enabled and sessions.ttl_s == 3600 and sessions.cache_s == 1.0
    assert sessions.compress.summariser is None and sessions.anchor.max_bytes == 2048
    assert _config().policy.scenarios["default"].switch == "on_failure"


@pytest.mark.parametrize(
    ("sessions", "path"),
    [
        ({"ttl_s": 0}, "sessions.ttl_s"),
        ({"max_sessions": 0}, "sessions.max_sessions"),
        ({"cache_s": -1}, "sessions.cache_s"),
        ({"cache_s": 3600}, "sessions.cache_s"),
        ({"anchor": {"max_bytes": 10}}, "sessions.anchor.max_bytes"),
        ({"anchor": {"fields": [""]}}, "sessions.anchor.fields"),
        ({"anchor": {"fields": ["x" * 65]}}, "sessions.anchor.fields"),
        ({"compress": {"keep_last": 0}}, "sessions.compress.keep_last"),
        ({"compress": {"summary_tokens": 10**6}}, "sessions.compress.summary_tokens"),
        ({"history_tokens": -1}, "sessions.history_tokens"),
        ({"history_max_bytes": 10}, "sessions.history_max_bytes"),
        ({"store": "maybe"}, "sessions.store"),
    ],
)
def test_bad_sessions_values_name_the_field(sessions: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _config(sessions=sessions)
    assert any(p.startswith(path) for p, _ in caught.value.problems), caught.value.problems


def test_a_switch_rule_must_be_one_of_three() -> None:
    with pytest.raises(ConfigError) as caught:
        _config(policy={"scenarios": {"default": {"switch": "sometimes"}}})
    assert any("switch" in p for p, _ in caught.value.problems)
    assert _config(policy={"scenarios": {"default": {"switch": "never"}}}).policy.scenarios["default"].switch == "never"


def test_a_summariser_must_be_a_local_model() -> None:
    with pytest.raises(ConfigError) as caught:
        _config(sessions={"compress": {"summariser": "nope"}})
    assert any("summariser" in p or "summariser" in r for p, r in caught.value.problems)
