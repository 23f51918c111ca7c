"""Fakes shared by the unit tests (one of each, checked by mypy like the code they stand in for)."""

from __future__ import annotations


class FakeClock:
    """A clock the test sets or advances by hand: call it for the time (what the code under test
    is given as `clock`), read or assign `.now`."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
