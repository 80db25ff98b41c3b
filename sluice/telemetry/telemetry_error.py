"""Why telemetry cannot start (its own module, so that the parts raising it need not import the package)."""

from __future__ import annotations


class TelemetrySetupError(Exception):
    """A telemetry part cannot start as configured (exporter not installed...). One line for the user."""
