"""Testing pipelines without a broker.

``run_pipeline`` runs a pipeline file over a list of records in memory -- the real engine, codec, batching,
dead letters and delivery -- and returns what was produced::

    from sluice.testing import run_pipeline

    def test_my_labels():
        run = run_pipeline("pipelines/label-reviews.yaml", [{"text": "great phone"}, b"not json"])
        assert run.output_values()[0]["label"] in {"positive", "negative"}
        assert "JSON" in run.dead_letter_reasons()[0]

:mod:`sluice.testing.memory_kafka` holds the in-memory source and sink under it (with a manual clock and an
event log), for tests that script rebalances or delivery failures around Sluice's runner.
"""

from sluice.testing.memory_kafka import EventLog, ManualClock, MemorySink, MemorySource, Produced
from sluice.testing.pipeline_run import PipelineRun, PipelineRunError, run_pipeline

__all__ = ["EventLog", "ManualClock", "MemorySink", "MemorySource", "PipelineRun", "PipelineRunError", "Produced",
           "run_pipeline"]
