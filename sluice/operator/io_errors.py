"""Errors from the operator's Kafka source and sink after which it must stop. Each message is one line a user
can act on; the runner makes it the run's stop reason (``sluice: stopped on error: ...``), never a traceback."""


class ProduceFailed(Exception):
    """The sink refused a record for good (a fatal client error, a fenced producer...)."""


class SourceFailed(Exception):
    """The consumer hit a fatal error (fenced by a static member with the same ``group.instance.id``...)."""
