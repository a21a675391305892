"""A namespace's lifecycle stream into DuckDB, and the questions people ask of it.

The engine writes ``<ns>.lifecycle`` as JSON when started with ``lifecycle_format=json``
(``RUNSTREAM_LIFECYCLE_FORMAT=json`` or ``runstream worker --lifecycle-format json``):
one object per record, the fields of docs/guides/analytics.md. Anything that reads JSON
from Kafka reads it; here a plain consumer (no Runstream code) loads it into a DuckDB
table, one row per event, and three queries answer:

- how many runs ended in each status, per hour they started;
- the p95 step duration per workflow;
- the steps that fail most.

    python -m examples.analytics.lifecycle_to_duckdb -n analytics --db runs.duckdb

The engine writes the topic in transactions: read it ``read_committed``. Records in
another format (written before the switch to json), and a foreign producer's JSON that is
no lifecycle event, are skipped and counted.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import duckdb
from confluent_kafka import Consumer, KafkaError, TopicPartition

#: The table's columns: the JSON record's fields, and where the record lies on the topic.
COLUMNS = {
    "type": "VARCHAR",
    "run_id": "VARCHAR",
    "at_ms": "BIGINT",
    "workflow": "VARCHAR",
    "version": "VARCHAR",
    "status": "VARCHAR",
    "seq": "INTEGER",
    "step": "VARCHAR",
    "attempt": "INTEGER",
    "duration_ms": "BIGINT",
    "output": "JSON",
    "error": "VARCHAR",
    "reason": "VARCHAR",
    "continued_as": "VARCHAR",
    "code": "VARCHAR",
    "tags": "MAP(VARCHAR, VARCHAR)",
    "input": "JSON",
    "key": "VARCHAR",
    "kafka_partition": "INTEGER",
    "kafka_offset": "BIGINT",
}

QUERIES = {
    # Each run's status is the one its last event carries (a run's events share one
    # partition, so the offset orders them); the hour is the one it started in.
    "runs_per_status_per_hour": """
        WITH runs AS (
            SELECT run_id,
                   min(at_ms) FILTER (WHERE type = 'run.started') AS started_ms,
                   arg_max(status, kafka_offset) AS status
            FROM lifecycle
            WHERE type <> 'event.unmatched'
            GROUP BY run_id
        )
        SELECT date_trunc('hour', make_timestamp(started_ms * 1000)) AS hour, status,
               count(*) AS runs
        FROM runs
        WHERE started_ms IS NOT NULL
        GROUP BY ALL
        ORDER BY hour, status
    """,
    "p95_step_duration_per_workflow": """
        SELECT workflow, count(*) AS steps,
               quantile_cont(duration_ms, 0.95) AS p95_ms, max(duration_ms) AS max_ms
        FROM lifecycle
        WHERE type = 'step.completed'
        GROUP BY workflow
        ORDER BY workflow
    """,
    "top_failing_steps": """
        SELECT workflow, step, count(*) AS failures, count(DISTINCT run_id) AS runs,
               arg_max(error, at_ms) AS last_error
        FROM lifecycle
        WHERE type = 'step.failed'
        GROUP BY workflow, step
        ORDER BY failures DESC, workflow, step
        LIMIT 10
    """,
}


def read_json_records(
    bootstrap: str, topic: str, config: dict[str, Any] | None = None
) -> tuple[list[dict[str, Any]], int]:
    """Every committed JSON record of ``topic`` up to its end, and how many records were
    skipped (not JSON: written before the switch)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "lifecycle-to-duckdb",  # assigned, never subscribed: nothing commits
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            **(config or {}),
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        if meta.error is not None:
            raise LookupError(f"{topic}: {meta.error}")
        parts = [TopicPartition(topic, p, 0) for p in meta.partitions]
        pending = {tp.partition for tp in parts}
        consumer.assign(parts)
        rows: list[dict[str, Any]] = []
        skipped = 0
        while pending:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                    continue
                raise RuntimeError(err)
            row = _event(msg.value())
            if row is None:
                skipped += 1
                continue
            row["kafka_partition"], row["kafka_offset"] = msg.partition(), msg.offset()
            rows.append(row)
        return rows, skipped
    finally:
        consumer.close()


def _event(value: bytes | None) -> dict[str, Any] | None:
    """The JSON lifecycle event ``value`` holds; None for another format, or a foreign
    producer's record that is no lifecycle event."""
    if not value or value[:1] != b"{":
        return None
    try:
        row = json.loads(value)
    except ValueError:
        return None
    ok = isinstance(row, dict) and all(isinstance(row.get(k), str) for k in ("type", "run_id"))
    return row if ok and isinstance(row.get("at_ms"), int) else None


def load(db: duckdb.DuckDBPyConnection, rows: list[dict[str, Any]]) -> None:
    """(Re)create table ``lifecycle`` from ``rows`` (the JSON records)."""
    columns = ", ".join(f"'{k}': '{v}'" for k, v in COLUMNS.items())
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "lifecycle.jsonl"
        staged.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        db.execute(
            "CREATE OR REPLACE TABLE lifecycle AS SELECT * FROM read_json("
            f"?, format='newline_delimited', columns={{{columns}}})",
            [str(staged)],
        )


def answers(db: duckdb.DuckDBPyConnection) -> dict[str, list[dict[str, Any]]]:
    """Each of `QUERIES`' answers, as rows of column -> value."""
    out = {}
    for name, sql in QUERIES.items():
        result = db.execute(sql)
        names = [d[0] for d in result.description]
        out[name] = [dict(zip(names, row, strict=True)) for row in result.fetchall()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--namespace", required=True)
    parser.add_argument(
        "--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    parser.add_argument("--db", default=":memory:", help="DuckDB file (default: in memory)")
    args = parser.parse_args()
    rows, skipped = read_json_records(args.bootstrap, f"{args.namespace}.lifecycle")
    with duckdb.connect(args.db) as db:
        load(db, rows)
        print(f"{len(rows)} lifecycle events loaded ({skipped} not JSON, skipped)")
        for name, found in answers(db).items():
            print(f"\n{name}:")
            for row in found:
                print("  " + ", ".join(f"{k}={v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
