#!/usr/bin/env python3
"""Start a Runstream run from any service, with nothing but confluent-kafka and fastavro.

This script deliberately does not import runstream: it shows the whole wire contract,
which a producer in any language can follow.

1. The value is Avro *single-object encoding*:
   ``C3 01`` + the 8-byte CRC-64-AVRO fingerprint (little-endian) of the schema's
   parsing canonical form + the Avro binary body. The schema is the shipped
   ``runstream.StartRun.avsc``.
2. The key is the run id (UTF-8), and the partition must be the one Kafka's Java
   client picks: murmur2 of the key (librdkafka: ``partitioner=murmur2_random``).
3. The topic is ``<namespace>.commands``.

Usage::

    python examples/produce_start_run.py --bootstrap 127.0.0.1:9092 --namespace shop \
        --workflow order --run-id order-42 --input '{"order_id": 42}'
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from fastavro import parse_schema, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

SCHEMA_FILE = "runstream.StartRun.avsc"


def find_schema(explicit: str | None) -> Path:
    """The .avsc given, else the one shipped in an installed runstream package (found
    as a plain file on sys.path, without importing it), else the one in this repo."""
    if explicit:
        return Path(explicit)
    candidates = [
        Path(entry) / "runstream" / "schemas" / SCHEMA_FILE for entry in sys.path if entry
    ]
    candidates.append(
        Path(__file__).resolve().parent.parent / "src/runstream/schemas" / SCHEMA_FILE
    )
    for path in candidates:
        if path.is_file():
            return path
    raise SystemExit(f"cannot find {SCHEMA_FILE}; pass --schema PATH")


def single_object_encoder(schema_json: dict):
    """A function record -> bytes for one schema, with the header computed once."""
    parsed = parse_schema(schema_json)
    fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema_json), "CRC-64-AVRO"))
    header = b"\xc3\x01" + fp

    def encode(record: dict) -> bytes:
        buf = io.BytesIO()
        buf.write(header)
        schemaless_writer(buf, parsed, record)
        return buf.getvalue()

    return encode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers")
    ap.add_argument("--namespace", required=True, help="Runstream namespace (topic prefix)")
    ap.add_argument("--workflow", required=True, help="registered workflow name")
    ap.add_argument("--run-id", default=None, help="run id (default: a random UUID)")
    ap.add_argument("--input", default="null", help="workflow input as JSON")
    ap.add_argument("--version", default=None, help="workflow version (default: newest)")
    ap.add_argument("--schema", default=None, help=f"path to {SCHEMA_FILE}")
    args = ap.parse_args()

    schema = json.loads(find_schema(args.schema).read_text(encoding="utf-8"))
    encode = single_object_encoder(schema)
    run_id = args.run_id or str(uuid.uuid4())
    value = encode(
        {
            "run_id": run_id,
            "workflow": args.workflow,
            # user payloads are UTF-8 JSON inside the Avro record
            "input": json.dumps(json.loads(args.input), separators=(",", ":")).encode(),
            "version": args.version,
            "parent_run_id": None,
            "tags": {},
            "sent_at_ms": int(time.time() * 1000),
        }
    )

    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            # Kafka's Java partitioner; librdkafka's default (consistent_random) differs
            "partitioner": "murmur2_random",
            "enable.idempotence": True,
        }
    )
    delivered: list = []
    producer.produce(
        f"{args.namespace}.commands",
        key=run_id.encode(),
        value=value,
        on_delivery=lambda err, msg: delivered.append((err, msg)),
    )
    producer.flush(30)
    if not delivered:
        print("error: not delivered within 30s", file=sys.stderr)
        return 1
    err, msg = delivered[0]
    if err is not None:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"started {run_id} on {msg.topic()}[{msg.partition()}]@{msg.offset()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
