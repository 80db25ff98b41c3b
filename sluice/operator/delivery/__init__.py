"""Delivery strategies: at-least-once and exactly-once behind one interface (base.py), chosen once by name."""

from __future__ import annotations

from sluice.operator.delivery.at_least_once import AtLeastOnce
from sluice.operator.delivery.strategy import Delivery, Outcome
from sluice.operator.delivery.transactional import Transactional

# pipeline ``delivery`` -> its strategy
STRATEGIES: dict[str, type[Delivery]] = {"at_least_once": AtLeastOnce, "exactly_once": Transactional}

__all__ = ["STRATEGIES", "AtLeastOnce", "Delivery", "Outcome", "Transactional"]
