"""The OpenTelemetry SDK's environment variables, read as its specification says; the pipeline's
``telemetry.tracing`` section overrides them key by key.

An operator that runs beside other instrumented services is configured the way they are: a collector named
once in the Deployment's environment reaches every container. Read here:

==========================================  ===============================================================
variable                                    effect (when the pipeline does not set the key)
==========================================  ===============================================================
``OTEL_TRACES_EXPORTER``                    ``otlp``, ``console`` or ``none`` (the first of a list)
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,     the collector; either one alone turns tracing on (``otlp``).
``OTEL_EXPORTER_OTLP_ENDPOINT``             Read by the exporter itself (``/v1/traces`` appended over HTTP)
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``,     ``grpc`` or ``http/protobuf``. Given nowhere: ``http/protobuf``,
``OTEL_EXPORTER_OTLP_PROTOCOL``             the specification's default (``grpc`` when the pipeline itself
                                            names the ``otlp`` exporter, as before these were read)
``OTEL_TRACES_SAMPLER``,                    the share of new traces recorded (``sample_ratio``):
``OTEL_TRACES_SAMPLER_ARG``                 ``always_on`` 1, ``always_off`` 0, ``traceidratio`` the argument;
                                            the ``parentbased_`` forms alike. An incoming ``traceparent``'s
                                            sampled flag decides for its record either way
``OTEL_SERVICE_NAME``,                      the spans' resource (sluice/telemetry/provider.py); the pipeline's
``OTEL_RESOURCE_ATTRIBUTES``                name is the service name when neither gives one
==========================================  ===============================================================

Pure: the environment is passed in. A value Sluice cannot honour is a :class:`TelemetrySetupError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluice.config import Tracing
from sluice.telemetry.telemetry_error import TelemetrySetupError

_PROTOCOLS = {"grpc": "grpc", "http/protobuf": "http"}
_RATIOS = {"always_on": 1.0, "always_off": 0.0, "parentbased_always_on": 1.0, "parentbased_always_off": 0.0}


def effective_tracing(cfg: Tracing, environ: Mapping[str, str]) -> Tracing:
    """``cfg`` with every key the pipeline left out taken from the ``OTEL_*`` variables."""
    given = cfg.model_fields_set
    update: dict[str, Any] = {}
    if "exporter" not in given:
        exporter = _exporter(environ)
        if exporter is not None:
            update["exporter"] = exporter
    if "protocol" not in given:
        name = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        if name:
            if name.strip() not in _PROTOCOLS:
                raise TelemetrySetupError(f"OTEL_EXPORTER_OTLP_PROTOCOL={name!r}: Sluice exports OTLP over 'grpc' "
                                          "or 'http/protobuf'")
            update["protocol"] = _PROTOCOLS[name.strip()]
        elif update.get("exporter") == "otlp":  # turned on by the environment: the specification's default
            update["protocol"] = "http"
    if "sample_ratio" not in given:
        ratio = _ratio(environ)
        if ratio is not None:
            update["sample_ratio"] = ratio
    return cfg.model_copy(update=update) if update else cfg


def service_attributes(service_name: str, environ: Mapping[str, str]) -> dict[str, str]:
    """Resource attributes Sluice adds to what the SDK reads from the environment: the service name,
    unless ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` names one (the SDK applies those)."""
    if environ.get("OTEL_SERVICE_NAME"):
        return {}
    pairs = (item.split("=", 1)[0].strip() for item in environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","))
    return {} if "service.name" in pairs else {"service.name": service_name}


def _exporter(environ: Mapping[str, str]) -> str | None:
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    if names:
        if names[0] not in ("otlp", "console", "none"):
            raise TelemetrySetupError(f"OTEL_TRACES_EXPORTER={names[0]!r}: Sluice exports to 'otlp', 'console' "
                                      "or 'none'")
        return names[0]
    if environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return "otlp"
    return None


def _ratio(environ: Mapping[str, str]) -> float | None:
    sampler = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if not sampler:
        return None
    if sampler in _RATIOS:
        return _RATIOS[sampler]
    if sampler in ("traceidratio", "parentbased_traceidratio"):
        arg = environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise TelemetrySetupError(f"OTEL_TRACES_SAMPLER_ARG={arg!r}: expected a ratio between 0 and 1")
        return ratio
    raise TelemetrySetupError(f"OTEL_TRACES_SAMPLER={sampler!r}: Sluice samples with always_on, always_off, "
                              "traceidratio or their parentbased_ forms")
