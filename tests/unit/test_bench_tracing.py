"""The benchmarks' tracing tools, from recorded events and readings, without a broker:
`benchmarks.trace` splits a run into its hops, `benchmarks.brokerstats` turns the broker's
cumulative request metrics and GC log into one workload's figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import brokerstats, trace


def test_breakdown_splits_a_run_into_its_hops() -> None:
    run: dict[str, Any] = {"run": "r1", "t0": 1000.0, "sent": 1001.0, "done": 1060.0}
    engine = [
        {"t": 1002.0, "t0": 1001.5, "ev": "poll", "wait": 0.5, "keys": ["other", "r1"]},
        {"t": 1004.0, "t0": 1003.5, "ev": "begin"},
        {"t": 1040.0, "t0": 1004.0, "ev": "send_offsets"},
        {"t": 1045.0, "t0": 1040.0, "ev": "commit"},
        {"t": 1045.0, "t0": 1003.0, "ev": "txn", "runs": ["r1"], "facts": 8},
        {"t": 1055.0, "t0": 1050.0, "ev": "txn", "runs": ["r1"], "facts": 2},
        {"t": 1070.0, "t0": 1065.0, "ev": "txn", "runs": ["r1"], "facts": 1},  # after the run
    ]
    replies = [(990.0, "client", 0), (1058.0, "client", 0)]

    trace._breakdown(run, engine, replies)

    assert run["hops"] == {
        "send": 1.0,
        "to_poll": 1.0,
        "decide": 1.0,
        "commit": 42.0,
        "more": 10.0,
        "reply": 3.0,
        "wake": 2.0,
    }
    assert run["txns"] == 2
    assert run["calls"] == {"begin": 0.5, "send_offsets": 36.0, "commit": 5.0}


def test_breakdown_marks_a_run_whose_command_was_not_seen() -> None:
    run: dict[str, Any] = {"run": "r1", "t0": 1000.0, "sent": 1001.0, "done": 1010.0}

    trace._breakdown(run, [], [])

    assert run["missing"] is True
    assert run["hops"] == {"send": 1.0}


def test_remote_breakdown_splits_each_remote_step_into_its_hops() -> None:
    """W8: two transactions of the run, the task polled and its result sent by the task
    worker between them, the result polled by the engine; another run's events ignored."""
    run: dict[str, Any] = {"run": "r1", "t0": 1000.0, "done": 1100.0, "hops": {}}
    engine = [
        {"t": 1010.0, "t0": 1005.0, "ev": "txn", "runs": ["r1"]},
        {"t": 1030.0, "t0": 1029.0, "ev": "poll", "keys": ["r1"]},
        {"t": 1034.0, "t0": 1032.0, "ev": "txn", "runs": ["r1"]},
        {"t": 1020.0, "t0": 1019.0, "ev": "poll", "keys": ["other"]},
    ]
    tasks = [
        {"t": 1012.0, "ev": "task_poll", "keys": ["other"]},
        {"t": 1015.0, "ev": "task_poll", "keys": ["r1"]},
        {"t": 1017.0, "ev": "result_send", "key": "r1"},
        {"t": 1016.0, "ev": "result_send", "key": "other"},
    ]

    trace._remote_breakdown(run, engine, tasks)

    assert run["hops"] == {"task": 5.0, "body": 2.0, "result": 13.0, "decide2": 2.0, "commit2": 2.0}
    assert "missing" not in run


def test_remote_breakdown_marks_a_step_whose_result_was_not_seen() -> None:
    run: dict[str, Any] = {"run": "r1", "t0": 1000.0, "done": 1100.0, "hops": {}}
    engine = [
        {"t": 1010.0, "t0": 1005.0, "ev": "txn", "runs": ["r1"]},
        {"t": 1034.0, "t0": 1032.0, "ev": "txn", "runs": ["r1"]},
    ]

    trace._remote_breakdown(run, engine, [{"t": 1015.0, "ev": "task_poll", "keys": ["r1"]}])

    assert run["missing"] is True


class FakeReadings(brokerstats.BrokerStats):
    """BrokerStats whose JMX readings are given, one per call."""

    def __init__(self, tmp: Path, readings: list[dict[str, list[float]]]) -> None:
        super().__init__(tmp, 0, tmp / "gc.log")
        self.readings = readings

    def read(self) -> dict[str, list[float]]:
        return self.readings.pop(0)


def test_broker_stats_give_the_mean_of_the_requests_since_the_last_reading(
    tmp_path: Path,
) -> None:
    stats = FakeReadings(
        tmp_path,
        [
            {"EndTxn:TotalTimeMs": [100, 2.0, 1.0, 9.0, 30.0], "Produce:TotalTimeMs": []},
            {"EndTxn:TotalTimeMs": [300, 3.0, 1.5, 12.0, 30.0], "Produce:TotalTimeMs": []},
        ],
    )
    stats.since_last()  # the warm-up's

    got = stats.since_last()["requests"]

    # 100 requests at 2 ms, then 200 more making the mean 3 ms: those 200 took 3.5 ms
    assert got["EndTxn"]["TotalTimeMs"] == {
        "n": 200,
        "mean": 3.5,
        "p50": 1.5,
        "p99": 12.0,
        "max_ever": 30.0,
    }
    assert "Produce" not in got


def test_broker_stats_count_only_the_gc_pauses_logged_since_the_last_reading(
    tmp_path: Path,
) -> None:
    gc_log = tmp_path / "gc.log"
    stats = FakeReadings(tmp_path, [{}, {}])
    gc_log.write_text(
        "[1.2s] Using G1\n"
        "[2.5s] GC(0) Pause Young (Normal) (G1 Evacuation Pause) 51M->9M(512M) 4.5ms\n"
    )
    stats.since_last()
    with gc_log.open("a") as f:
        f.write("[9.1s] GC(1) Pause Young (Normal) (G1 Evacuation Pause) 60M->10M(512M) 21.25ms\n")
        f.write("[9.9s] GC(2) Pause Remark 70M->70M(512M) 1.75ms\n")
        f.write("[9.9s] GC(3) Concurrent Mark Cycle 80.0ms\n")  # concurrent: no pause

    assert stats.since_last()["gc"] == {"pauses": 2, "total_ms": 23.0, "max_ms": 21.2}
