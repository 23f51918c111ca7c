"""The capability / health snapshot a decision record names (router/learning/decision_inputs.py `plan_snapshot`)
is remembered by its inputs: requests that saw the same targets, providers and health share one id and one
body, a change in health makes a new one, and inputs that cannot be remembered are still answered."""

from __future__ import annotations

from router.learning.decision_inputs import content_id, plan_snapshot
from router.routing.capabilities import local_target


class Unhashable(dict[str, str]):
    """A mapping whose values are fine but which cannot be a cache key in its own items."""

    def items(self):  # type: ignore[no-untyped-def, override]
        return [(k, [v]) for k, v in super().items()]  # lists: unhashable


def test_the_same_inputs_share_one_snapshot_and_a_health_change_makes_another() -> None:
    targets = [local_target("m", {"max_model_len": 4096})]
    first = plan_snapshot(targets, ["cloud-sim"], {}, {"local:m": "green"})
    again = plan_snapshot(list(targets), ("cloud-sim",), {}, {"local:m": "green"})
    assert again[0] == first[0] and again[1] is first[1]
    assert first[0] == content_id(first[1])
    changed = plan_snapshot(targets, ["cloud-sim"], {}, {"local:m": "red"})
    assert changed[0] != first[0] and changed[1]["health"] == {"local:m": "red"}
    assert plan_snapshot(targets, ["cloud-sim"], {"local:m": "down"}, {})[1]["unavailable"] == {"local:m": "down"}


def test_inputs_that_cannot_be_remembered_are_still_answered() -> None:
    targets = [local_target("m", {"max_model_len": 4096})]
    snapshot_id, body = plan_snapshot(targets, [], {}, Unhashable({"local:m": "green"}))
    assert snapshot_id == content_id(body) and body["health"] == {"local:m": ["green"]}
