"""`benchmarks compare`'s reading and aggregation of the systems' result files, from small
recorded JSON fixtures (tests/unit/compare_fixtures/), without running any system."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import compare

FIXTURES = Path(__file__).parent / "compare_fixtures"


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    data.pop("_what")
    return data


def legs_for(rounds: list[dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Legs as compare records them: per round, per system, its figures."""
    return [
        {"round": r, "system": s, "figures": figures}
        for r, by_system in enumerate(rounds, start=1)
        for s, figures in by_system.items()
    ]


def all_figures() -> dict[str, dict[str, Any]]:
    return {
        "runstream": compare.runstream_figures(fixture("runstream")),
        "restate": compare.restate_figures(fixture("restate"))[0],
        "dbos": compare.dbos_figures(fixture("dbos"))[0],
        "temporal": compare.temporal_figures(fixture("temporal"))[0],
    }


def entry(figures: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return next(e for e in figures if e["key"] == key)


def test_runstream_figures_read_cpu_per_1000_runs_and_recovery_cost() -> None:
    f = compare.runstream_figures(fixture("runstream"))
    assert f["CPU_engine"] == {"main": 0.55}
    assert f["CPU_total"] == {"main": 2.05}
    assert f["W4_restart_s"] == {"main": 6.686}
    assert f["W4_recovery_s"] == {"main": 4.843}


def test_runstream_figures_read_the_floor_round_trip_of_w3s_shape() -> None:
    data = fixture("runstream")
    median = {"p50": {"median": 4.79}, "p99": {"median": 18.3}}
    data["floor"] = {"summary": {"round_trip_ms": median}}
    assert compare.runstream_figures(data)["floor_round_trip_p50"] == {"main": 4.79}
    assert "floor_round_trip_p50" not in compare.runstream_figures(fixture("runstream"))


def test_restate_cpu_is_server_plus_service_per_1000_runs_median_over_reps() -> None:
    f, _ = compare.restate_figures(fixture("restate"))
    # (4.0 + 2.0) / 2000 and (4.4 + 2.4) / 2000 per 1,000 runs: 3.0 and 3.4
    assert f["CPU_engine"] == {"main": pytest.approx(3.2)}
    assert f["CPU_total"] == {"main": pytest.approx(3.2)}


def test_restate_recovery_cost_takes_the_whole_sleep_as_due_and_only_the_plain_w4() -> None:
    f, _ = compare.restate_figures(fixture("restate"))
    # the variant with a 5 s outage is not W4; 6.6 s - the 2 s sleep
    assert f["W4_restart_s"] == {"main": 6.6}
    assert f["W4_recovery_s"] == {"main": pytest.approx(4.6)}


def test_dbos_cpu_counts_python_and_postgres_over_timed_and_warmup_runs() -> None:
    f, _ = compare.dbos_figures(fixture("dbos"))
    assert f["CPU_engine"]["thread pool"] == pytest.approx(30.0 / 2128 * 1000, abs=1e-3)
    assert f["CPU_total"]["thread pool"] == pytest.approx(20.0)
    assert f["CPU_total"]["queue, poll 0.05 s"] == pytest.approx(30.0)
    assert "queue, poll 1 s" not in f["CPU_total"]  # no such file in the fixture


def test_dbos_recovery_cost_subtracts_the_sleep_due_at_the_kill_from_its_step_times() -> None:
    f, _ = compare.dbos_figures(fixture("dbos"))
    # kill -> restart 3.02 - 2.97 = 0.05 s; the deadline 1.5 s after the restart:
    # due at the kill 1.55 s; 2.97 - 1.55
    assert f["W4_recovery_s"] == {"main": pytest.approx(1.42)}


def test_temporal_figures_map_activities_and_local_activities_as_variants() -> None:
    f, notes = compare.temporal_figures(fixture("temporal"))
    assert f["W1_p50"] == {"activities": 350.0, "local activities": 50.0}
    assert f["W1_p99"] == {"activities": 420.0, "local activities": 60.0}
    assert f["W2_runs_per_s"] == {"activities": 20.0, "local activities": 40.0}
    assert f["W3_p50"] == {"main": 60.0}
    assert f["W4_runs"] == {"main": 200}
    assert f["W4_lost"] == {"main": 0}
    assert f["W4_restart_s"] == {"main": 5.5}
    assert f["W4_recovery_s"] == {"main": pytest.approx(3.5)}
    # (server 100 + worker 20) / 2000 runs, (40 + 10) / 2000: the client's CPU is not counted
    assert f["CPU_total"] == {"activities": 60.0, "local activities": 25.0}
    assert f["RSS_engine"] == {"activities": 260.0, "local activities": 230.0}
    assert notes["w4_at_kill"]["runs_before_step_not_done_at_kill"] == 50


def test_missing_files_give_no_figures_rather_than_errors() -> None:
    assert compare.temporal_figures({})[0] == {}
    assert compare.dbos_figures({})[0] == {}
    assert compare.restate_figures({})[0] == {}


def test_aggregate_picks_the_best_peer_over_every_variant_and_checks_the_goal() -> None:
    f = all_figures()
    figures = compare.aggregate(legs_for([f, f]), list(compare.SYSTEMS))
    cpu = entry(figures, "CPU_total")
    assert cpu["best_peer"]["system"] == "restate"
    assert cpu["ratio"] == pytest.approx(2.05 / 3.2, abs=1e-3)
    assert cpu["goal"] == 0.5 and cpu["goal_met"] is False
    w1 = entry(figures, "W1_p50")
    assert w1["best_peer"]["system"] == "restate"  # 9.6 ms, not Temporal's local 50 ms
    assert w1["goal_met"] is True
    w4 = entry(figures, "W4_recovery_s")
    assert w4["best_peer"] == {"system": "dbos", "variant": "main", "median": 1.42}
    assert w4["ratio"] == pytest.approx(4.843 / 1.42, abs=1e-3)


def test_spread_over_15_percent_is_flagged_for_any_system() -> None:
    first = all_figures()
    second = copy.deepcopy(first)
    second["runstream"]["W2_runs_per_s"] = {"main": 500.0}  # 362.3 and 500: 32 %
    second["temporal"]["W2_runs_per_s"]["local activities"] = 60.0  # 40 and 60: 40 %
    figures = compare.aggregate(legs_for([first, second]), list(compare.SYSTEMS))
    w2 = entry(figures, "W2_runs_per_s")
    assert w2["runstream"]["spread"] == pytest.approx(137.7 / 431.15, abs=1e-3)
    assert w2["runstream_spread_within_goal"] is False
    assert w2["spread_over_goal"] == ["runstream main", "temporal local activities"]
    assert entry(figures, "W1_p50")["spread_over_goal"] == []


def test_medians_are_over_five_rounds() -> None:
    rounds = []
    for rate in (300.0, 310.0, 320.0, 330.0, 900.0):
        f = all_figures()
        f["runstream"]["W2_runs_per_s"] = {"main": rate}
        rounds.append(f)
    w2 = entry(compare.aggregate(legs_for(rounds), list(compare.SYSTEMS)), "W2_runs_per_s")
    assert w2["runstream"]["n"] == 5
    assert w2["runstream"]["median"] == 320.0


def report_for(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    legs = legs_for(rounds)
    systems = list(compare.SYSTEMS)
    report: dict[str, Any] = {
        "command": "python -m benchmarks compare --rounds 2",
        "started": "2026-12-02T03:00:00+00:00",
        "machine": {"nproc": 2, "cpu_model": "AMD EPYC", "memory_total_mb": 8000},
        "settings": {"systems": systems, "rounds": len(rounds)},
        "systems": {s: {"status": "ok"} for s in systems},
        "legs": legs,
        "sizes_line": {s: s for s in systems},
    }
    report["figures"] = compare.aggregate(legs, systems)
    report["versions_line"] = compare.versions_line(report)
    return report


def test_markdown_has_a_temporal_column_spreads_goals_and_how_cpu_was_measured() -> None:
    first = all_figures()
    second = copy.deepcopy(first)
    second["runstream"]["W2_runs_per_s"] = {"main": 500.0}
    md = compare.markdown(report_for([first, second]))
    head = next(line for line in md.splitlines() if line.startswith("| figure"))
    assert "| Restate | DBOS | Temporal |" in head and head.endswith("| goal |")
    cpu = next(
        line for line in md.splitlines() if line.startswith("| CPU per 1,000 runs in W2: engine +")
    )
    cells = [c.strip() for c in cpu.strip("|").split("|")]
    assert cells[-1] == "≤ 0.5x ✗"
    assert cells[-2] == "0.64x"
    assert cells[-3] == "Restate"
    assert cells[-4] == "activities: 60.00 s, spread 0 %; local activities: 25.00 s, spread 0 %"
    w2 = next(line for line in md.splitlines() if line.startswith("| W2 throughput"))
    assert "32 % ⚠ > 15 %" in w2
    assert "Temporal: its bench.py's Ctx" in md
    assert "Temporal dev server (temporal version 0.0.0-DEV" not in md  # no versions in legs
    assert "its production deployment" in md


def test_systems_is_another_name_for_only_and_temporal_is_a_system() -> None:
    args = compare.parser().parse_args(["--systems", "runstream,temporal"])
    assert args.only == "runstream,temporal"
    assert compare.PORTS["temporal"] == (7233,)


def test_a_report_shows_paths_in_and_beside_the_repository_relative_to_it() -> None:
    root = compare.ROOT
    assert compare.shown(root / ".venv" / "bin" / "python") == ".venv/bin/python"
    assert compare.shown(root.parent / "shared" / "peers") == "../shared/peers"
    assert compare.shown(root) == "."
    assert compare.shown("bash") == "bash"
    assert compare.shown("/proc/peer-restate") == "/proc/peer-restate"  # a --work elsewhere
