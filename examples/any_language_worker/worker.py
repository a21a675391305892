#!/usr/bin/env python3
"""A Runstream task worker with nothing but confluent-kafka, fastavro and the .avsc files.

It does not import runstream: everything it does is the wire contract, which a worker
in any language with a Kafka client and an Avro library can follow.

1. Consume ``runstream.StepTask`` records from ``<ns>.tasks.<group>`` in the consumer
   group of the same name, with ``isolation.level=read_committed`` (the engine
   produces tasks inside its Kafka transactions).
2. Run the step named ``name`` with ``args`` (a UTF-8 JSON array of positional
   arguments).
3. Produce a ``runstream.StepResult`` to ``<ns>.commands``, keyed by the run id, on
   the partition Kafka's Java client would pick (librdkafka:
   ``partitioner=murmur2_random``), copying ``run_id``, ``seq``, ``attempt`` and
   ``attempt_id`` from the task.
4. Commit the task's offset only after Kafka acknowledged the result. A crash in
   between re-delivers the task; the engine accepts one result per attempt id and
   ignores the rest, so running it twice is harmless.

Every value is Avro single-object encoded: ``C3 01`` + the 8-byte CRC-64-AVRO
fingerprint (little-endian) of the schema's parsing canonical form + the Avro body.

Usage::

    python examples/any_language_worker/worker.py --bootstrap 127.0.0.1:9092 \
        --namespace shop --group polyglot
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

MAGIC = b"\xc3\x01"


# -- the steps this worker serves ------------------------------------------------------


class Task:
    """What a step body may use besides its arguments: who it is, and a heartbeat."""

    def __init__(self, record: dict[str, Any], heartbeat: Callable[[Any], None]) -> None:
        self.record = record
        self.heartbeat = heartbeat  # call it at least every heartbeat_ms on long work


def shout(task: Task, text: str) -> str:
    return text.upper() + "!"


def add(task: Task, *numbers: float) -> float:
    return sum(numbers)


def nap(task: Task, seconds: float) -> str:
    """Sleeps, heartbeating twice per `heartbeat_ms` when the step declares `heartbeat=`."""
    interval_s = (task.record["heartbeat_ms"] or seconds * 1000) / 2000
    until = time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        task.heartbeat({"left_s": round(left, 1)})
        time.sleep(min(interval_s, left))
    return f"slept {seconds}s"


STEPS: dict[str, Callable[..., Any]] = {"shout": shout, "add": add, "nap": nap}


# -- Avro single-object encoding -------------------------------------------------------


def find_schemas(explicit: str | None) -> Path:
    """--schemas, else $RUNSTREAM_SCHEMAS, else the .avsc files of an installed runstream
    (found as plain files on sys.path, not imported), else the ones in this repository."""
    if explicit or os.environ.get("RUNSTREAM_SCHEMAS"):
        return Path(explicit or os.environ["RUNSTREAM_SCHEMAS"])
    candidates = [Path(entry) / "runstream" / "schemas" for entry in sys.path if entry]
    candidates.append(Path(__file__).resolve().parents[2] / "src" / "runstream" / "schemas")
    for path in candidates:
        if (path / "runstream.StepTask.avsc").is_file():
            return path
    raise SystemExit("cannot find the runstream .avsc files; pass --schemas DIR")


def load(file: Path) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(file.read_text(encoding="utf-8"))
    return schema


def schema_fingerprint(schema: dict[str, Any]) -> bytes:
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


def single_object_encoder(schema: dict[str, Any]) -> Callable[[dict[str, Any]], bytes]:
    """A function record -> bytes for one schema, its header computed once."""
    parsed, header = parse_schema(schema), MAGIC + schema_fingerprint(schema)

    def encode(record: dict[str, Any]) -> bytes:
        buf = io.BytesIO()
        buf.write(header)
        schemaless_writer(buf, parsed, record)  # left-out fields get their defaults
        return buf.getvalue()

    return encode


class TaskDecoder:
    """Reads StepTask values. A value names its writer schema by fingerprint: the current
    runstream.StepTask.avsc, or an older version shipped beside it (StepTask.v1.avsc...),
    whose records are resolved into the current schema."""

    def __init__(self, directory: Path) -> None:
        current = directory / "runstream.StepTask.avsc"
        self.reader = parse_schema(load(current))
        self.writers = {
            schema_fingerprint(schema): parse_schema(schema)
            for schema in map(load, [current, *directory.glob("runstream.StepTask.v*.avsc")])
        }

    def __call__(self, value: bytes | None) -> dict[str, Any]:
        if not value or value[:2] != MAGIC or len(value) < 10:
            raise ValueError("not an Avro single-object value")
        writer = self.writers.get(value[2:10])
        if writer is None:
            raise ValueError(f"no StepTask schema has fingerprint {value[2:10].hex()}")
        task = schemaless_reader(io.BytesIO(value[10:]), writer, self.reader)
        assert isinstance(task, dict)  # a record schema reads as a dict
        return task


# -- the worker loop -------------------------------------------------------------------


class Worker:
    """Serves one task group: one task at a time, each answered before it is committed."""

    def __init__(self, bootstrap: str, namespace: str, group: str, schemas: Path) -> None:
        self.group = group
        self.decode_task = TaskDecoder(schemas)
        self.encode_result = single_object_encoder(load(schemas / "runstream.StepResult.avsc"))
        self.encode_heartbeat = single_object_encoder(load(schemas / "runstream.Heartbeat.avsc"))
        self.tasks_topic = f"{namespace}.tasks.{group}"
        self.commands_topic = f"{namespace}.commands"
        self.me = f"{socket.gethostname()}:{os.getpid()}"
        self.stopping = False
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": self.tasks_topic,  # every worker of a group shares the tasks
                "isolation.level": "read_committed",  # only tasks of committed transactions
                "enable.auto.commit": False,  # commit a task only once its result is acked
                "auto.offset.reset": "earliest",  # tasks sent before the group existed
            }
        )
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "partitioner": "murmur2_random",  # Kafka's Java partitioner, as the engine
                "enable.idempotence": True,  # no duplicates from our own retries; acks=all
            }
        )

    def run(self) -> None:
        self.wait_for_tasks_topic()
        self.consumer.subscribe([self.tasks_topic])
        print(f"serving {self.tasks_topic} as {self.me}", file=sys.stderr, flush=True)
        try:
            # One task at a time: when a body runs we are not polling, so the consumer
            # takes no more tasks (back-pressure). A body longer than the consumer's
            # max.poll.interval.ms (5 min by default) would need a bigger setting.
            while not self.stopping:
                msg = self.consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error() is not None:
                    print(f"consumer: {msg.error()}", file=sys.stderr, flush=True)
                    continue
                self.handle(msg.value())
                try:
                    self.consumer.commit(message=msg, asynchronous=False)
                except KafkaException as exc:  # e.g. the partition moved meanwhile
                    print(f"commit: {exc} (the task comes again)", file=sys.stderr, flush=True)
        finally:
            self.producer.flush(30)
            self.consumer.close()  # leave the group now, so its tasks move at once

    def wait_for_tasks_topic(self) -> None:
        """An engine creates the task topic of each group its App declares, when it starts.
        Subscribe only once it exists: librdkafka notices a topic created after the
        subscription only at its next metadata refresh (5 minutes by default)."""
        while not self.stopping:
            try:
                found = self.consumer.list_topics(self.tasks_topic, timeout=5).topics
                if found[self.tasks_topic].error is None:
                    return
            except KafkaException:  # no broker answered yet
                pass
            print(f"waiting for topic {self.tasks_topic}", file=sys.stderr, flush=True)
            time.sleep(1)

    def handle(self, value: bytes | None) -> None:
        try:
            task = self.decode_task(value)
        except Exception as exc:  # not ours to answer: no run id; the engine times it out
            print(f"skipping an unreadable task: {exc}", file=sys.stderr, flush=True)
            return
        deadline = task["deadline_ms"]
        if deadline is not None and time.time() * 1000 > deadline:
            return  # the engine has timed this attempt out; it ignores a late result
        started = time.monotonic()
        outcome = self.run_step(task)
        self.send_result(
            {
                # copied from the task: the engine accepts only its open attempt's result
                "run_id": task["run_id"],
                "seq": task["seq"],
                "attempt": task["attempt"],
                "attempt_id": task["attempt_id"],
                **outcome,
                "duration_ms": int((time.monotonic() - started) * 1000),
                "worker": self.me,
            }
        )

    def run_step(self, task: dict[str, Any]) -> dict[str, Any]:
        """The ok, output, error, traceback and retryable fields of the task's result."""
        step = STEPS.get(task["name"])
        if step is None:  # waiting will not teach this worker the step: fail for good
            known = ", ".join(sorted(STEPS))
            error = (
                f"UnknownStep: group {self.group!r} has no step {task['name']!r} "
                f"in this worker (it serves: {known})"
            )
            return {"ok": False, "output": b"null", "error": error, "retryable": False}
        try:
            args = json.loads(task["args"])
            output = step(Task(task, lambda details: self.send_heartbeat(task, details)), *args)
            return {"ok": True, "output": json.dumps(output).encode()}
        except Exception as exc:  # the step's failure is data: the engine retries per policy
            return {
                "ok": False,
                "output": b"null",
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(),
                "retryable": True,
            }

    def send_result(self, result: dict[str, Any]) -> None:
        """Produce the result and wait for Kafka's ack (acks=all, idempotent producer)."""
        value = self.encode_result(result)
        acks: list[Any] = []
        self.producer.produce(
            self.commands_topic,
            key=result["run_id"].encode(),
            value=value,
            on_delivery=lambda err, _msg: acks.append(err),
        )
        while not acks:  # only then may the task's offset be committed
            self.producer.poll(0.5)
        if acks[0] is not None:
            raise KafkaException(acks[0])  # not committed: the task comes back

    def send_heartbeat(self, task: dict[str, Any], details: Any) -> None:
        beat = {
            "run_id": task["run_id"],
            "seq": task["seq"],
            "attempt_id": task["attempt_id"],
            "details": json.dumps(details).encode(),
            "sent_at_ms": int(time.time() * 1000),
        }
        value = self.encode_heartbeat(beat)
        self.producer.produce(self.commands_topic, key=task["run_id"].encode(), value=value)
        self.producer.poll(0)  # fire and forget: a lost heartbeat is covered by the next


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers")
    ap.add_argument("--namespace", required=True, help="Runstream namespace (topic prefix)")
    ap.add_argument("--group", required=True, help="the task group to serve")
    ap.add_argument("--schemas", default=None, help="directory of the runstream .avsc files")
    args = ap.parse_args()

    worker = Worker(args.bootstrap, args.namespace, args.group, find_schemas(args.schemas))

    def stop(signum: int, _frame: Any) -> None:
        worker.stopping = True  # the task in hand is finished, answered and committed first

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
