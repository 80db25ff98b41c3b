"""When the reloader loads a change (sluice/operator/reload/watch.py): pure, with plain numbers for time."""

from __future__ import annotations

from sluice.operator.reload.watch import ChangeWatcher


def test_a_change_is_loaded_once_it_has_settled_and_not_again() -> None:
    w = ChangeWatcher("v1", poll_interval_s=30, settle_s=1.0)
    assert not w.observe("v1", 0.0) and w.next_look_s(0.0) == 30
    assert not w.observe("v2-half-written", 10.0)  # first sighting: wait for it to settle
    assert w.next_look_s(10.0) == 1.0  # and look again soon, not in 30 s
    assert not w.observe("v2", 10.5)  # still being written
    assert not w.observe("v2", 11.0) and w.observe("v2", 11.5)  # unchanged for settle_s: load it
    w.accept("v2")
    assert not w.observe("v2", 50.0) and w.next_look_s(50.0) == 30


def test_a_missing_model_is_never_loaded_and_a_refused_version_waits_for_the_next() -> None:
    w = ChangeWatcher("v1", poll_interval_s=5, settle_s=0.0)
    assert not w.observe(None, 1.0)  # deleted, or mid-swap: keep serving
    assert w.observe("broken", 2.0)  # an atomic swap settles at once
    w.accept("broken")  # it failed to load
    assert not w.observe("broken", 7.0) and not w.observe("broken", 12.0)  # not retried...
    assert w.observe("fixed", 17.0)  # ...until it changes again
