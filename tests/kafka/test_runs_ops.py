"""`runstream runs retry` and `runstream runs cancel --where` against the real broker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter, defaultdict

import pytest
from click.testing import CliRunner

import runstream
from runstream.audit import check_run
from runstream.cli.main import cli
from runstream.cli.runs_cmd import model_path
from runstream.cli.runs_ops import CancelJob
from runstream.schemas.codec import Codec
from runstream.topics.admin import ensure_topics

from .flows import make_app
from .kit import PARTITIONS, ROOT, ThreadWorker, read_topic, wait_for

pytestmark = pytest.mark.kafka


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def journal_of(bootstrap: str, ns: str) -> dict[str, list]:
    """Each run's journal facts, typed, in order."""
    codec, facts = Codec.default(), defaultdict(list)
    for _name, _rec, msg in read_topic(bootstrap, f"{ns}.journal", timeout=60):
        fact = codec.decode(msg.value())
        facts[fact.run_id].append(fact)
    return facts


def status_of(client: runstream.Client, run_id: str) -> str | None:
    try:
        return client.get_run(run_id).status
    except runstream.RunNotFound:  # not started yet
        return None


def test_runs_retry_of_a_run_that_failed_in_its_third_step_reruns_only_that_step(
    kafka_bootstrap, ns, tmp_path
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    calls: Counter[str] = Counter()
    provider_down = True
    app = runstream.App(ns, bootstrap=kafka_bootstrap)

    @app.step
    def reserve(x: int) -> int:
        calls["reserve"] += 1
        return x + 1

    @app.step
    def pack(x: int) -> int:
        calls["pack"] += 1
        return x + 1

    @app.step(retries=1, backoff=0.1)
    def charge(x: int) -> int:
        calls["charge"] += 1
        if provider_down:
            raise ConnectionError("the payment provider is down")
        return x + 1

    @app.workflow
    async def order(ctx: runstream.Context, x: int) -> int:
        x = await ctx.step(reserve, x)
        x = await ctx.step(pack, x)
        return await ctx.step(charge, x)

    worker = ThreadWorker(app, tmp_path / "state")
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            client.start("order", 1, run_id="o-1")
            with pytest.raises(runstream.RunFailed, match="provider is down"):
                client.result("o-1", timeout=60)
            assert calls == {"reserve": 1, "pack": 1, "charge": 2}

            provider_down = False
            out = invoke("runs", "retry", "o-1", "-n", ns, "--bootstrap", kafka_bootstrap)
            assert out.exit_code == 0, out.output
            wait_for(lambda: client.get_run("o-1").status == "completed", what="retried run")
            assert client.result("o-1", timeout=10) == 4
            assert calls == {"reserve": 1, "pack": 1, "charge": 3}  # only the failed step

            # An ended run retried with new input: a new run, linked both ways.
            (tmp_path / "input.json").write_text("10")
            out = invoke(
                "runs", "retry", "o-1", "--input", str(tmp_path / "input.json"),
                "-n", ns, "--bootstrap", kafka_bootstrap,
            )  # fmt: skip
            assert out.exit_code == 0 and "as new run o-1~1" in out.output, out.output
            wait_for(lambda: status_of(client, "o-1~1") == "completed", what="the new run")
            assert client.result("o-1~1", timeout=10) == 13
    finally:
        worker.stop()
    journal = journal_of(kafka_bootstrap, ns)
    names = [type(f).__name__ for f in journal["o-1"]]
    assert names.count("RunRetried") == 1 and names[-1] == "RetriedAsNew"
    assert journal["o-1"][-1].new_run_id == "o-1~1"
    assert journal["o-1~1"][0].tags == {"retry_of": "o-1"}
    for run_id in ("o-1", "o-1~1"):
        assert check_run(journal[run_id], expect_finished=True) == [], run_id


def test_runs_cancel_where_cancels_500_runs_and_survives_a_sigkill_halfway(
    kafka_bootstrap, ns, tmp_path
):
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    worker = ThreadWorker(make_app(ns, kafka_bootstrap), tmp_path / "state")
    cache = tmp_path / "cache"
    common = ["-n", ns, "--bootstrap", kafka_bootstrap, "--cache-dir", str(cache)]
    where = "workflow=approval,status=running,tag.batch=b1"
    wanted = [f"w-{i:03}" for i in range(500)]
    others = [f"keep-{i:02}" for i in range(20)]
    try:
        with runstream.Client(ns, kafka_bootstrap) as client:
            for run_id in wanted:
                client.start("approval", run_id=run_id, tags={"batch": "b1"}, wait=False)
            for run_id in others:
                client.start("approval", run_id=run_id, tags={"batch": "b2"}, wait=False)
            client.flush()

            def running() -> int:
                out = invoke("runs", "list", *common, "--status", "running", "--json")
                assert out.exit_code == 0, out.output
                return int(json.loads(out.stdout)["count"])

            wait_for(lambda: running() == 520, timeout=120, what="520 running runs")

            dry = invoke("runs", "cancel", "--where", where, *common, "--dry-run", "--json")
            assert dry.exit_code == 0, dry.output
            assert sorted(json.loads(dry.stdout)["runs"]) == wanted

            # The CLI, slowed to 100 cancels a second, killed once it is part way.
            job_file = CancelJob.path(
                model_path(cache, kafka_bootstrap, ns).with_name(f"{ns}.jobs"),
                {"workflow": "approval", "status": "running", "tag.batch": "b1"},
            )
            env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
            cmd = [sys.executable, "-m", "runstream", "runs", "cancel", "--where", where]
            proc = subprocess.Popen(
                [*cmd, *common, "--rate", "100"], env=env, stderr=subprocess.DEVNULL
            )
            try:

                def part_way() -> bool:
                    job = CancelJob.load(job_file)
                    return job is not None and 100 <= job.sent < 500

                wait_for(part_way, timeout=60, interval=0.05, what="the job part way")
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
            job = CancelJob.load(job_file)
            assert job is not None and job.sent < 500 and sorted(job.runs) == wanted

            again = invoke("runs", "cancel", "--where", where, *common, "--json")
            assert again.exit_code == 0, again.output
            summary = json.loads(again.stdout)
            assert summary["statuses"] == {"cancelled": 500} and summary["open"] == []
            assert not job_file.exists()
            assert running() == 20
    finally:
        worker.stop()
    journal = journal_of(kafka_bootstrap, ns)
    cancelled = {
        r for r, facts in journal.items() for f in facts if type(f).__name__ == "RunCancelled"
    }
    assert cancelled == set(wanted)
    for run_id in wanted:  # each ended once, by the job, and the journal holds its rules
        facts = journal[run_id]
        assert [type(f).__name__ for f in facts].count("RunCancelled") == 1
        assert check_run(facts, expect_finished=True) == [], run_id


def test_runs_cancel_where_run_again_later_cancels_the_runs_that_match_then(
    kafka_bootstrap, ns, tmp_path
):
    """A job whose cancels were all sent is over, even if its runs had not ended when it
    stopped waiting: the same command later is a new job that selects again."""
    ensure_topics(kafka_bootstrap, ns, PARTITIONS)
    app, state = make_app(ns, kafka_bootstrap), tmp_path / "state"
    common = ["-n", ns, "--bootstrap", kafka_bootstrap, "--cache-dir", str(tmp_path / "cache")]
    where = ["runs", "cancel", "--where", "workflow=approval,status=running,tag.batch=b1"]
    first, later = ["a-1", "a-2", "a-3"], ["b-1", "b-2"]
    with runstream.Client(ns, kafka_bootstrap) as client:
        worker = ThreadWorker(app, state)
        try:
            for run_id in first:
                client.start("approval", run_id=run_id, tags={"batch": "b1"})
            wait_for(lambda: all(status_of(client, r) == "running" for r in first), what="a-*")
        finally:
            worker.stop()
        # no engine: the cancels are sent, and nobody ends the runs before the job stops waiting
        out = invoke(*where, *common, "--wait", "0", "--json")
        assert out.exit_code == 1, out.output
        assert sorted(json.loads(out.stdout)["open"]) == first
        worker = ThreadWorker(app, state)
        try:
            wait_for(lambda: all(status_of(client, r) == "cancelled" for r in first), what="a-*")
            for run_id in later:
                client.start("approval", run_id=run_id, tags={"batch": "b1"})
            wait_for(lambda: all(status_of(client, r) == "running" for r in later), what="b-*")
            again = invoke(*where, *common, "--json")
            assert again.exit_code == 0, again.output
            summary = json.loads(again.stdout)
            assert (summary["runs"], summary["statuses"]) == (2, {"cancelled": 2})
            assert [status_of(client, r) for r in later] == ["cancelled", "cancelled"]
        finally:
            worker.stop()
