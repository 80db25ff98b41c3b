"""The progress watchdog: a part that owes work and gets none done past the bound is stalled, and only then."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.operator.watchdog import Probe, Watchdog


class Part:
    """A probe the test drives: whether work is owed, and a progress counter."""

    def __init__(self) -> None:
        self.owed, self.progress, self.waiting = False, 0, ""

    def __call__(self) -> Probe:
        return Probe(self.owed, self.progress, self.waiting)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_part_owing_work_without_progress_stalls_after_the_bound_and_recovers_when_it_moves() -> None:
    clock, engine = Clock(), Part()
    dog = Watchdog({"engine": engine}, stall_after_s=10, clock=clock)
    engine.owed, engine.waiting = True, "3 records queued"
    assert dog.check() == []
    clock.now += 10
    assert dog.check() == []  # at the bound: not yet
    clock.now += 0.5
    [stall] = dog.check()
    assert stall.reason == "engine: no progress for 10 s with 3 records queued"
    engine.progress += 1
    assert dog.check() == []  # it moved: healthy at once
    clock.now += 10.5
    assert [s.part for s in dog.check()] == ["engine"]  # and silent again for longer than the bound
    engine.owed = False
    assert dog.check() == []  # owing nothing is never a stall


def test_idle_time_before_work_arrives_does_not_count() -> None:
    clock, engine = Clock(), Part()
    dog = Watchdog({"engine": engine}, stall_after_s=10, clock=clock)
    dog.check()
    clock.now += 3600  # an hour with nothing to do
    assert dog.check() == []
    engine.owed = True
    assert dog.check() == []  # work arrived just now: the bound starts here
    clock.now += 9
    assert dog.check() == []


def test_changes_report_each_transition_once() -> None:
    clock, loop, delivery = Clock(), Part(), Part()
    dog = Watchdog({"poll loop": loop, "delivery": delivery}, stall_after_s=1, clock=clock)
    loop.owed = delivery.owed = True
    assert dog.changes() == ([], [])
    clock.now += 2
    new, recovered = dog.changes()
    assert [s.part for s in new] == ["poll loop", "delivery"] and recovered == []
    assert dog.changes() == ([], [])  # still stalled: nothing new to say
    loop.progress += 1
    new, recovered = dog.changes()
    assert new == [] and [s.part for s in recovered] == ["poll loop"]


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Watchdog({}, stall_after_s=0, clock=Clock())


@given(st.lists(st.tuples(st.floats(0, 30), st.booleans(), st.booleans()), max_size=60))
def test_stalled_exactly_when_owed_and_silent_past_the_bound(steps: list[tuple[float, bool, bool]]) -> None:
    """Checked once per step (the runner's tick): the verdict matches a model of "owed without a break, and no
    progress, for longer than the bound", measured from the later of the two."""
    bound = 10.0
    clock, part = Clock(), Part()
    dog = Watchdog({"engine": part}, stall_after_s=bound, clock=clock)
    dog.check()
    moved_s, owed_since = clock.now, None
    for dt, owed, progressed in steps:
        clock.now += dt
        part.owed = owed
        if progressed:
            part.progress += 1
            moved_s = clock.now
        owed_since = (owed_since if owed_since is not None else clock.now) if owed else None
        expected = owed_since is not None and clock.now - max(moved_s, owed_since) > bound
        assert bool(dog.check()) == expected
