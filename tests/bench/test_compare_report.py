"""bench/compare_report.py: the ratios, the queue-wait check and the tuning choice drawn from a result."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import compare_report  # noqa: E402


def _load(rate: float, p50: float, p99: float, wait_p99: float | None = None) -> dict[str, Any]:
    load: dict[str, Any] = {"rate": rate, "offered": int(rate * 5), "delivered": int(rate * 5),
                            "latency_ms": {"p50": p50, "p99": p99, "max": p99}, "overloaded": False}
    if wait_p99 is not None:
        load["queue_wait_ms"] = {"p50": 20.0, "p99": wait_p99}
    return load


def _overloaded(rate: float) -> dict[str, Any]:
    return {"rate": rate, "offered": 100, "delivered": 40, "latency_ms": {}, "overloaded": True}


def _result(sluice_wait_p99: float = 23.0) -> dict[str, Any]:
    def sat(peer: str, batch: int, rate: float) -> dict[str, Any]:
        return {"workload": "embed", "peer": peer, "batch": batch, "delay_ms": 20, "records_per_s": rate,
                "num_records": 100, "span_s": 1.0, "cpu_us_per_record": 1000.0, "cpu_cores": 1.0}

    return {
        "mode": "quick", "loads": [0.25, 0.5, 0.9], "defaults": {"embed": [32, 20], "noop": [512, 5]}, "skipped": {},
        "saturation": [sat("sluice", 32, 100.0), sat("plain", 1, 50.0), sat("faust", 32, 80.0),
                       sat("faust", 8, 90.0), sat("sluice", 8, 120.0)],
        "latency": [
            {"peer": "sluice", "workload": "embed", "batch": 32, "delay_ms": 20,
             "loads": [_load(25, 30, 60, 21.0), _load(50, 35, 70, sluice_wait_p99), _load(90, 80, 300, 90.0)]},
            {"peer": "faust", "workload": "embed", "batch": 32, "delay_ms": 20,
             "loads": [_load(25, 30, 90), _overloaded(50)]},
        ],
        "tuning": [
            {"delay_ms": 5, "batch": 8, **_load(50, 20, 90, 10.0)},
            {"delay_ms": 5, "batch": 32, **_load(50, 25, 400, 200.0)},
            {"delay_ms": 50, "batch": 32, **_load(50, 90, 180, 60.0)},
        ],
        "machine": {"cpu_count": 2, "platform": "test", "python": "3.11", "load_average_1m_start": 1.0,
                    "load_average_1m_end": 1.0},
        "versions": {"sluice": "0.1.0"},
    }


def test_ratios_at_default_batch_and_best_against_best() -> None:
    embed = compare_report.ratios(_result())["embed"]
    assert embed["plain"] == {"default": 2.0, "best": 120.0 / 50.0}
    assert embed["faust"]["default"] == 100.0 / 80.0
    assert embed["faust"]["best"] == 120.0 / 90.0


def test_queue_wait_is_checked_at_half_load_against_delay_plus_5_ms() -> None:
    assert compare_report.queue_wait_check(_result(sluice_wait_p99=25.0)) == {"p99_ms": 25.0, "limit_ms": 25,
                                                                               "ok": True}
    assert compare_report.queue_wait_check(_result(sluice_wait_p99=25.5))["ok"] is False  # type: ignore[index]


def test_the_tuning_rows_whose_queue_wait_stays_within_the_delay_are_named() -> None:
    result = _result()
    assert compare_report.queue_wait_meeting(result) == [(5, 8)]  # 10 <= 10; 200 > 10; 60 > 55
    assert "delay 5 ms with batch 8 (compare_tuning.md)" in compare_report.markdown(result)
    result["tuning"][2]["queue_wait_ms"]["p99"] = 55.0
    assert compare_report.queue_wait_meeting(result) == [(5, 8), (50, 32)]


def test_tuning_picks_the_most_throughput_that_meets_each_target() -> None:
    text = compare_report.tuning_markdown(_result())
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in text.splitlines()
            if line.startswith("| ") and " ms |" in line and "max_batch_size" in line}
    assert rows["100 ms"] == "max_batch_size 8, max_queue_delay_ms 5"  # the only one under 100 ms
    assert rows["250 ms"] == "max_batch_size 8, max_queue_delay_ms 5"  # batch 8 saturates at 120 rec/s
    tight = _result()
    for row in tight["tuning"]:
        row["latency_ms"]["p99"] = 5000.0
    assert "| 100 ms | none measured meets it | – |" in compare_report.tuning_markdown(tight)


def test_report_marks_overload_unmet_targets_and_a_producer_that_fell_behind(tmp_path: Path) -> None:
    result = _result(sluice_wait_p99=40.0)
    result["latency"][1]["loads"][0]["achieved_rate"] = 10.0  # asked 25/s
    result["latency"][0]["loads"][0]["achieved_rate"] = 24.9  # close enough: no note
    text = compare_report.write_report(result, tmp_path)
    assert "30 / 90 (offered only 10/s)" in text
    assert text.count("offered only") == 1
    assert "overloaded (40/100 out)" in text
    assert "target ≥ 1.3x: met" in text  # 1.25x at the default batch, 1.33x best against best
    assert "limit max_queue_delay_ms + 5 = 25 ms: NOT met" in text
    for name in ("compare.md", "compare_tuning.md", "compare_throughput.png", "compare_latency.png"):
        assert (tmp_path / name).stat().st_size > 0
