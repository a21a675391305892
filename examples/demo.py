"""The Runstream demo: a local Kafka, one engine process, two orders end to end.

Order A goes through steps, a durable sleep and a human approval (a signal); order B
is declined at the card, so its stock reservation is compensated. The card is charged
by a remote step, which a task worker process serves. Every lifecycle event is printed
as it streams from Kafka.

    python examples/demo.py            # starts (and stops) its own local broker
    KAFKA_BOOTSTRAP_SERVERS=host:port python examples/demo.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

import runstream
from runstream.schemas.codec import Codec
from runstream.schemas.records import LifecycleEvent
from runstream.topics.admin import client_config, ensure_topics

ROOT = Path(__file__).resolve().parents[1]


def tail_lifecycle(
    bootstrap: str, topic: str, stop: threading.Event, waiting: threading.Event
) -> None:
    """Print each lifecycle event as it is committed; set ``waiting`` when order-A
    waits for its approval."""
    consumer = Consumer(
        {
            **client_config(bootstrap),
            "group.id": f"demo-{uuid.uuid4()}",
            "enable.auto.commit": False,
        }
    )  # read_committed is the default
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    codec = Codec.default()
    while not stop.is_set():
        msg = consumer.poll(0.2)
        if msg is None or msg.error():
            continue
        e = codec.decode(msg.value())
        assert isinstance(e, LifecycleEvent)
        at = datetime.fromtimestamp(e.at_ms / 1000).strftime("%H:%M:%S.%f")[:-3]
        what = e.step or e.workflow
        extra = e.error or e.reason or ""
        if e.duration_ms is not None:
            extra = f"{e.duration_ms} ms {extra}".strip()
        print(f"  {at}  {e.type:<15} {e.run_id:<10} {what:<34} {extra}", flush=True)
        if e.run_id == "order-A" and "waiting for signal" in (e.reason or ""):
            waiting.set()
    consumer.close()


def main() -> None:
    bootstrap = os.environ.get("RUNSTREAM_BOOTSTRAP_SERVERS") or os.environ.get(
        "KAFKA_BOOTSTRAP_SERVERS"
    )
    work = Path(tempfile.mkdtemp(prefix="runstream-demo-"))
    broker = None
    if not bootstrap:
        from runstream.dev import localkafka

        print("Starting a local Kafka broker (KRaft, from Maven jars)...", flush=True)
        broker = localkafka.LocalKafka(
            work / "kafka", libs=localkafka.ensure_jars(), die_with_parent=True
        )
        bootstrap = broker.start()
        print(f"Kafka is up at {bootstrap}", flush=True)
    ns = f"shop-demo-{uuid.uuid4().hex[:6]}"
    ensure_topics(bootstrap, ns, partitions=4, task_groups=["payments"])
    env = {
        **os.environ,
        "RUNSTREAM_DEMO_NS": ns,
        "RUNSTREAM_BOOTSTRAP_SERVERS": bootstrap,
        "PYTHONPATH": str(ROOT),
    }
    engine_log = work / "engine.log"
    print(f"Starting an engine instance for namespace {ns} (log: {engine_log})...", flush=True)
    with engine_log.open("wb") as out:  # the child keeps its own fd
        engine = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runstream",
                "worker",
                "examples.shop:app",
                "--instance",
                "demo-1",
                "--state-dir",
                str(work / "state"),
            ],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    worker_log = work / "task-worker.log"
    print(
        f"Starting a task worker for group 'payments', which runs the remote step "
        f"charge_card (log: {worker_log})...",
        flush=True,
    )
    with worker_log.open("wb") as out:
        serve = ["tasks", "serve", "examples.shop:app", "--group", "payments"]
        task_worker = subprocess.Popen(
            [sys.executable, "-m", "runstream", *serve, "--concurrency", "4"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    stop, waiting = threading.Event(), threading.Event()
    tail = threading.Thread(
        target=tail_lifecycle, args=(bootstrap, f"{ns}.lifecycle", stop, waiting)
    )
    try:
        tail.start()
        client = runstream.Client(ns, bootstrap)
        order_a = {"id": "A", "item": "teapot", "amount": 42.0}
        order_b = {"id": "B", "item": "piano", "amount": 5000.0}
        client.start("checkout", order_a, run_id="order-A")
        client.start("checkout", order_b, run_id="order-B")
        if not waiting.wait(60):
            raise SystemExit("order-A never reached its approval step")
        print("  -- order-A waits for approval; sending signal 'approve' --", flush=True)
        client.signal("order-A", "approve", {"by": "ann"})
        outcome_a = f"order-A completed: {client.result('order-A', timeout=60)}"
        try:
            client.result("order-B", timeout=60)
            outcome_b = "order-B completed (unexpected)"
        except runstream.RunFailed as exc:
            outcome_b = f"order-B failed, stock released: {exc.error}"
        time.sleep(0.5)  # let the last events print
        client.close()
    finally:
        stop.set()
        tail.join(5)
        for proc in (task_worker, engine):
            proc.terminate()
            proc.wait(30)
        if broker is not None:
            broker.stop()
    print(f"\n{outcome_a}\n{outcome_b}", flush=True)


if __name__ == "__main__":
    main()
