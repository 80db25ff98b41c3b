"""Telemetry on the real broker: trace context from input to output headers, and /metrics, /readyz live."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from sluice.config import load_pipeline
from sluice.operator.build import build_runner
from sluice.telemetry import build_observer
from sluice.telemetry.traceparent import parse
from tests.integration.pipelines import write_pipeline
from tests.support import metric_lint
from tests.support.kafka import ConsumedRecord, consume_all, create_topic, produce, unique_topic

pytestmark = pytest.mark.kafka


def pipeline_with(path: Path, bootstrap: str, telemetry: dict[str, object]) -> tuple[Path, str, str, str]:
    t_in, t_out, t_dlq = unique_topic("in"), unique_topic("out"), unique_topic("dlq")
    for name, partitions in ((t_in, 2), (t_out, 2), (t_dlq, 1)):
        create_topic(bootstrap, name, partitions)
    write_pipeline(path, bootstrap, t_in, t_out, unique_topic("g"), dlq=t_dlq)
    doc = yaml.safe_load(path.read_text())
    doc["telemetry"] = telemetry
    path.write_text(yaml.safe_dump(doc))
    return path, t_in, t_out, t_dlq


def source_of(record: ConsumedRecord, dead_letter: bool) -> tuple[int, int]:
    h = {k: (v or b"").decode() for k, v in record.headers}
    if dead_letter:
        return int(h["sluice.error.partition"]), int(h["sluice.error.offset"])
    return int(h["sluice.source.partition"]), int(h["sluice.source.offset"])


def traceparent_of(record: ConsumedRecord) -> bytes:
    values = [v for k, v in record.headers if k == "traceparent"]
    assert len(values) == 1, f"expected exactly one traceparent, got {values}"  # the input's was replaced
    assert values[0] is not None
    return values[0]


def test_outputs_join_their_inputs_traces_and_batch_spans_link_their_records(kafka_bootstrap: str,
                                                                            tmp_path: Path) -> None:
    path, t_in, t_out, t_dlq = pipeline_with(tmp_path / "p.yaml", kafka_bootstrap,
                                             {"tracing": {"sample_ratio": 0.0}, "status": "off"})
    sent: list[tuple[str, str, list[tuple[str, str]]]] = []
    for i in range(300):
        flags = "01" if i % 3 else "00"  # two thirds sampled upstream, one third not
        header = f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-{flags}"
        value = "not json" if i % 25 == 0 else json.dumps({"text": f"t{i}"})
        sent.append((f"k{i}", value, [("traceparent", header)]))
    for i in range(40):  # no context at all: each starts a trace of its own (ratio 0: not recorded)
        sent.append((f"n{i}", json.dumps({"text": f"n{i}"}), []))
    positions = produce(kafka_bootstrap, t_in, sent)
    input_header = {pos: (dict(rec[2]).get("traceparent")) for pos, rec in zip(positions, sent, strict=True)}

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    loaded = load_pipeline(path)
    runner, engine = build_runner(loaded, observer=build_observer(loaded.pipeline, tracer_provider=provider),
                                  idle_exit_s=2)
    try:
        summary = runner.run()
    finally:
        engine.close()
    assert summary.error is None
    num_bad = sum(1 for _, v, _ in sent if v == "not json")
    out = consume_all(kafka_bootstrap, t_out, expected_count=len(sent) - num_bad)
    dlq = consume_all(kafka_bootstrap, t_dlq, expected_count=num_bad)
    assert len(out) + len(dlq) == len(sent)

    spans = exporter.get_finished_spans()
    send_spans = {s.context.span_id: s for s in spans if s.name.startswith("send ")}
    consume_spans = {s.context.span_id: s for s in spans if s.name.startswith("process ")}
    new_traces = set()
    for rec, dead in [(r, False) for r in out] + [(r, True) for r in dlq]:
        got = parse(traceparent_of(rec))
        assert got is not None
        upstream = input_header[source_of(rec, dead)]
        if upstream is None:
            assert not got.sampled
            new_traces.add(got.trace_id)
            continue
        assert got.trace_id.decode() == upstream[3:35]  # joins its input's trace
        assert got.sampled == upstream.endswith("01")
        if got.sampled:  # its parent is the recorded send span, child of the record's consume span
            send = send_spans[int(got.parent_id, 16)]
            assert send.parent is not None
            consume = consume_spans[send.parent.span_id]
            assert consume.parent is not None and f"{consume.parent.span_id:016x}" == upstream[36:52]
    assert len(new_traces) == 40

    batches = [s for s in spans if s.name == "batch"]
    linked = [link.context.span_id for b in batches for link in b.links]
    batched_consumes = {i for i, s in consume_spans.items() if s.status.is_ok}  # the rest failed to decode
    assert sorted(linked) == sorted(batched_consumes)  # every batched record span linked, exactly once
    for b in batches:  # a record's consume span ends the moment its batch starts
        members = {i for i in batched_consumes if consume_spans[i].end_time == b.start_time}
        assert {link.context.span_id for link in b.links} == members


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def counters(port: int) -> dict[str, float]:
    _, body = get(port, "/metrics")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            key = s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()) if k != "pipeline")
            out[key] = s.value
    return out


def test_metrics_count_every_record_and_readiness_waits_for_warm_up_and_partitions(kafka_bootstrap: str,
                                                                                   tmp_path: Path) -> None:
    path, t_in, _, _ = pipeline_with(tmp_path / "p.yaml", kafka_bootstrap,
                                     {"metrics": {"enabled": True, "port": 0}, "status": "off"})
    n, num_bad = 600, 30
    records = [(f"k{i}", "{broken" if i % 20 == 0 else json.dumps({"text": f"t{i}"})) for i in range(n)]
    produce(kafka_bootstrap, t_in, records)
    loaded = load_pipeline(path)

    observer = build_observer(loaded.pipeline)
    port = observer.server.port  # type: ignore[attr-defined]
    assert get(port, "/healthz")[0] == 200
    assert get(port, "/readyz") == (503, "not ready: the engine is warming up\n")
    runner, engine = build_runner(loaded, observer=observer)
    assert get(port, "/readyz") == (503, "not ready: no partition assigned yet\n")
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while get(port, "/readyz")[0] != 200:
            assert time.monotonic() < deadline, "never became ready"
            time.sleep(0.1)
        while True:  # scraped while the pipeline runs
            c = counters(port)
            if c.get("sluice_records_out_total", 0) + c.get("sluice_records_dead_lettered_total,stage=decode", 0) >= n:
                break
            assert time.monotonic() < deadline, f"counters never reached {n}: {c}"
            time.sleep(0.2)
        assert c["sluice_records_in_total"] == n
        assert c["sluice_records_out_total"] == n - num_bad
        assert c["sluice_records_dead_lettered_total,stage=decode"] == num_bad
        assert c["sluice_queue_delay_seconds_count"] == n - num_bad  # every decoded record went through a batch
        assert c["sluice_end_to_end_latency_seconds_count"] == n
        identity = runner.serving.identity  # engine metrics carry the model: name, short digest, engine
        model = f",digest={identity.digest[:12]},engine=python,model=tests.integration.funcs:tag"
        assert c["sluice_batch_size_records_sum" + model] == n - num_bad
        assert c["sluice_engine_warmup_seconds" + model] >= 0
        assert c[f"sluice_model_info{model},sha256={identity.digest}"] == 1
        assert c["sluice_assigned_partitions"] == 2
        while not any(k.startswith("sluice_consumer_lag_records") for k in counters(port)):  # librdkafka's
            assert time.monotonic() < deadline + 15, "no consumer lag reported"  # statistics: every 5 s
            time.sleep(0.5)
        live = metric_lint.families(get(port, "/metrics")[1])
    finally:
        runner.stop()
        thread.join(30)
        engine.close()
    assert not thread.is_alive()
    with pytest.raises(urllib.error.URLError):  # the server stops with the runner
        get(port, "/healthz")
    # the live scrape follows the naming rules, and the Grafana dashboard's queries find their metrics in it
    # (those of the LLM engine, which this python pipeline does not run, in the full collector's)
    assert metric_lint.lint(live) == []
    names = metric_lint.exposed(live)
    for title, used in metric_lint.dashboard_metrics().items():
        llm = {m for m in used if m.startswith("sluice_llm_")}
        assert used - llm <= names, f"panel {title!r} queries {sorted(used - llm - names)}, not in a live scrape"
        assert llm <= metric_lint.exposed(metric_lint.every_part_scrape()), title


def test_a_hung_engine_turns_healthz_to_503_within_the_bound_and_back_once_it_moves(kafka_bootstrap: str,
                                                                                   tmp_path: Path) -> None:
    from tests.integration import funcs

    path, t_in, _, _ = pipeline_with(tmp_path / "p.yaml", kafka_bootstrap,
                                     {"metrics": {"enabled": True, "port": 0}, "status": "off"})
    doc = yaml.safe_load(path.read_text())
    doc["engine"]["function"] = "tests.integration.funcs:hang_on_request"
    doc["runtime"]["stall_timeout_s"] = 2
    path.write_text(yaml.safe_dump(doc))
    produce(kafka_bootstrap, t_in, [(f"k{i}", json.dumps({"text": f"t{i}"})) for i in range(50)])
    loaded = load_pipeline(path)
    observer = build_observer(loaded.pipeline)
    port = observer.server.port  # type: ignore[attr-defined]
    runner, engine = build_runner(loaded, observer=observer)
    funcs.UNHANG.clear()
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while counters(port).get("sluice_records_out_total", 0) < 50:  # healthy while it works
            assert get(port, "/healthz") == (200, "ok\n")
            assert time.monotonic() < deadline, "the first records never came out"
            time.sleep(0.2)
        assert get(port, "/readyz")[0] == 200
        produce(kafka_bootstrap, t_in, [("h", json.dumps({"text": "hang"}))] +
                [(f"k{i}", json.dumps({"text": f"t{i}"})) for i in range(50, 60)])
        hung_s = time.monotonic()
        while (answer := get(port, "/healthz"))[0] == 200:
            assert time.monotonic() - hung_s < 2 + 5, "/healthz never noticed the hung engine"
            time.sleep(0.2)
        code, body = answer
        assert code == 503 and body.startswith("stalled: engine: no progress for "), body
        assert "a batch running" in body
        assert get(port, "/readyz")[0] == 503
        stalled = {k: v for k, v in counters(port).items() if k.startswith("sluice_progress_stalled")}
        assert stalled == {"sluice_progress_stalled,part=engine": 1, "sluice_progress_stalled,part=poll_loop": 0,
                           "sluice_progress_stalled,part=delivery": 0}
        funcs.UNHANG.set()  # the engine call returns: healthy again
        while get(port, "/healthz")[0] != 200:
            assert time.monotonic() < deadline, "/healthz stayed 503 after the engine moved again"
            time.sleep(0.2)
    finally:
        funcs.UNHANG.set()
        runner.stop()
        thread.join(30)
        engine.close()
    assert runner.summary.num_out == 61 and runner.summary.error is None
