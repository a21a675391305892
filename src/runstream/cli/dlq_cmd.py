"""`runstream dlq`: read the dead-letter topic and produce its records again.

Every record of ``<ns>.dlq`` is a `DeadLetter`: why (reason and code), where the original
record was (topic, partition, offset) and the original's key and value. A letter is
named by its place in the dlq, ``PARTITION:OFFSET`` (a bare offset will do when only
one partition has it).

``redrive`` produces a letter's original value (or an edited one) to its source topic
with its key, carrying two headers: the redrive count (``REDRIVE_HEADER``) and the
letter it came from (``REDRIVE_OF_HEADER``). So the redrive is recorded on the record
itself, and a record that fails again comes back to the dlq with its redrive count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import IO, Any

import click
from rich import box
from rich.console import Console
from rich.table import Table

from runstream.cli import exits, options
from runstream.engine import payload
from runstream.engine.partitioner import partition_for
from runstream.errors import DecodeError, SchemaError, TopicError
from runstream.schemas.codec import Codec
from runstream.schemas.records import (
    COMMANDS,
    REDRIVE_HEADER,
    REDRIVE_OF_HEADER,
    Command,
    DeadLetter,
)
from runstream.settings import Settings
from runstream.topics.admin import client_config
from runstream.topics.kafka import CommandSender
from runstream.topics.spec import Topics

# The field of each command that holds a user payload (JSON bytes): shown and edited as JSON.
_PAYLOADS = {"StartRun": "input", "Signal": "payload", "StepResult": "output"}
_COMMAND_NAMES = frozenset(cls.AVRO for cls in COMMANDS)
# Bytes that are not a JSON payload are shown as {"$bytes": text}; surrogateescape keeps
# every byte, so editing the text and saving gives back exactly the bytes meant.
_BYTES = "$bytes"


class LetterNotFound(exits.NotFound):
    """No dead letter at that place in the dlq."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One record of the dlq: its place, and the letter (None if it does not decode)."""

    partition: int
    offset: int
    letter: DeadLetter | None
    problem: str = ""  # why the record is not a readable DeadLetter

    @property
    def id(self) -> str:
        return f"{self.partition}:{self.offset}"


# -- pure helpers ------------------------------------------------------------------------


def parse_id(text: str) -> tuple[int | None, int]:
    """``"2:17"`` -> (2, 17); ``"17"`` -> (None, 17)."""
    part, sep, offset = text.strip().rpartition(":")
    try:
        return (int(part) if sep else None), int(offset)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not PARTITION:OFFSET (e.g. 0:12)") from None


def find(entries: list[Entry], text: str) -> Entry:
    """The entry ``text`` names; LetterNotFound if none, or a bare offset in several."""
    partition, offset = parse_id(text)
    hits = [e for e in entries if e.offset == offset and partition in (None, e.partition)]
    if not hits:
        raise LetterNotFound(f"no dead letter at {text} (see `runstream dlq list`)")
    if len(hits) > 1:
        where = ", ".join(e.id for e in hits)
        raise LetterNotFound(f"offset {offset} is in several partitions ({where}): say which")
    return hits[0]


def selected(entry: Entry, since: int | None, reason: str | None) -> bool:
    """``--since`` and ``--reason`` (any case, in the reason or the code) both hold."""
    letter = entry.letter
    if letter is None:
        return since is None and (reason is None or reason.lower() in entry.problem.lower())
    if since is not None and letter.at_ms < since:
        return False
    return reason is None or reason.lower() in f"{letter.code} {letter.reason}".lower()


def to_document(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    """A decoded record as JSON to read and edit: its type, then its fields, the user
    payload as the JSON it holds, other bytes as {"$bytes": text}."""
    doc: dict[str, Any] = {"type": name}
    for field, value in fields.items():
        if isinstance(value, bytes):
            value = _payload(value) if field == _PAYLOADS.get(name) else _bytes(value)
        doc[field] = value
    return doc


def from_document(doc: Any, codec: Codec) -> bytes:
    """`to_document`'s inverse: the record encoded (SchemaError if it does not fit)."""
    if not isinstance(doc, dict) or doc.get("type") not in _COMMAND_NAMES:
        names = ", ".join(sorted(_COMMAND_NAMES))
        raise SchemaError(f'the edited record needs "type": one of {names}')
    name, fields = doc["type"], {k: v for k, v in doc.items() if k != "type"}
    for field, value in fields.items():
        if isinstance(value, dict) and set(value) == {_BYTES}:
            fields[field] = str(value[_BYTES]).encode("utf-8", "surrogateescape")
        elif field == _PAYLOADS.get(name):
            fields[field] = payload.dumps(value)
    return codec.encode_raw(name, fields)


def describe_value(value: bytes | None, codec: Codec) -> dict[str, Any] | None:
    """The original record decoded when it can be; else its size, why, and a safe preview."""
    if value is None:
        return None
    try:
        return to_document(*codec.decode_raw(value))
    except DecodeError as exc:
        return {"undecodable": str(exc), "size": len(value), "preview": repr(value[:200])}


def letter_dict(entry: Entry, codec: Codec | None = None) -> dict[str, Any]:
    """An entry as JSON; with ``codec``, the original record decoded too."""
    out: dict[str, Any] = {"id": entry.id, "partition": entry.partition, "offset": entry.offset}
    letter = entry.letter
    if letter is None:
        return {**out, "problem": entry.problem}
    out |= {
        "at": options.iso(letter.at_ms),
        "code": letter.code,
        "reason": letter.reason,
        "run_id": letter.run_id,
        "redrives": letter.redrives,
        "source": {
            "topic": letter.source_topic,
            "partition": letter.partition,
            "offset": letter.offset,
        },
        "key": None if letter.key is None else letter.key.decode(errors="replace"),
    }
    if codec is not None:
        out["value"] = describe_value(letter.value, codec)
    return out


def _payload(value: bytes) -> Any:
    try:
        return payload.shown(value)
    except ValueError:  # not JSON (a start refused for that): keep it editable
        return _bytes(value)


def _bytes(value: bytes) -> dict[str, str]:
    return {_BYTES: value.decode("utf-8", "surrogateescape")}


# -- Kafka ---------------------------------------------------------------------------------


def read_letters(settings: Settings, ns: str, partition: int | None = None) -> list[Entry]:
    """Every record of ``<ns>.dlq`` (of one partition, if given), in partition order."""
    topic, decode = Topics(ns).dlq, Codec.default().decode
    entries = []
    for batch in options.read_topic(settings, topic, None if partition is None else [partition]):
        for rec in batch:
            try:
                letter = decode(rec.value)
            except DecodeError as exc:
                entries.append(Entry(rec.partition, rec.offset, None, f"undecodable: {exc}"))
                continue
            if isinstance(letter, DeadLetter):
                entries.append(Entry(rec.partition, rec.offset, letter))
            else:
                entries.append(Entry(rec.partition, rec.offset, None, f"a {letter.AVRO}"))
    return sorted(entries, key=lambda e: (e.partition, e.offset))


# -- commands --------------------------------------------------------------------------------


@click.group()
def dlq() -> None:
    """The dead-letter topic: list, show and redrive its records."""


@dlq.command("list")
@options.namespace
@options.bootstrap
@click.option(
    "--since", default=None, help="Only letters this recent: 30m, 2h, 1d or a UTC ISO time."
)
@click.option("--reason", default=None, help="Only letters whose reason or code has TEXT.")
@options.json_output
def list_letters(
    namespace: str, bootstrap: str | None, since: str | None, reason: str | None, as_json: bool
) -> None:
    """List the dead letters of NAMESPACE, oldest first in each partition."""
    settings = Settings().with_bootstrap(bootstrap)
    after = options.time_ms(since, "--since")
    entries = [e for e in read_letters(settings, namespace) if selected(e, after, reason)]
    if as_json:
        click.echo(json.dumps([letter_dict(e) for e in entries], indent=2))
        return
    table = Table(box=box.SIMPLE, pad_edge=False)
    for name in ("ID", "AT", "CODE"):
        table.add_column(name, no_wrap=True)
    table.add_column("RUN", overflow="fold")
    table.add_column("REDRIVES", no_wrap=True)
    table.add_column("REASON", overflow="fold")  # its first line: `show` has all
    for e in entries:
        letter = e.letter
        if letter is None:
            table.add_row(e.id, "", "", "", "", f"not a dead letter: {e.problem}")
            continue
        when = options.iso(letter.at_ms)
        redrives = str(letter.redrives or "")
        reason = letter.reason.splitlines()[0] if letter.reason else ""
        table.add_row(e.id, when, letter.code, letter.run_id or "", redrives, reason)
    console = Console()
    if not console.is_terminal:  # a pipe or a file: room for the reasons, not 80 columns
        console = Console(width=160)
    console.print(table)
    click.echo(f"{len(entries)} dead letter(s) in {Topics(namespace).dlq}")


@dlq.command("show")
@click.argument("letter_id", metavar="PARTITION:OFFSET")
@options.namespace
@options.bootstrap
@options.json_output
def show(letter_id: str, namespace: str, bootstrap: str | None, as_json: bool) -> None:
    """Show one dead letter: why, where the original came from, and the original record
    (decoded when it can be)."""
    settings = Settings().with_bootstrap(bootstrap)
    entry = find(read_letters(settings, namespace, parse_id(letter_id)[0]), letter_id)
    doc = letter_dict(entry, Codec.default())
    if as_json:
        click.echo(json.dumps(doc, indent=2))
        return
    if entry.letter is None:
        click.echo(f"{entry.id}: not a dead letter ({entry.problem})")
        return
    src = doc["source"]
    click.echo(f"dead letter {doc['id']} of {Topics(namespace).dlq}, at {doc['at']}")
    click.echo(f"  code:     {doc['code']}")
    click.echo(f"  reason:   {doc['reason']}")
    click.echo(f"  run:      {doc['run_id'] or '-'}")
    click.echo(f"  source:   {src['topic']} partition {src['partition']} offset {src['offset']}")
    click.echo(f"  key:      {doc['key']!r}")
    click.echo(f"  redrives: {doc['redrives']}")
    value = doc["value"]
    click.echo("  original: " + ("none kept" if value is None else json.dumps(value, indent=2)))


@dlq.command("redrive")
@click.argument("letter_ids", nargs=-1, required=True, metavar="PARTITION:OFFSET...")
@options.namespace
@options.bootstrap
@click.option("--edit", is_flag=True, help="Edit each record (as JSON) in $EDITOR first.")
@click.option(
    "--from-file",
    type=click.File("r"),
    default=None,
    help="Produce this JSON record (as --edit shows it) instead of the original.",
)
@options.json_output
def redrive(
    letter_ids: tuple[str, ...],
    namespace: str,
    bootstrap: str | None,
    edit: bool,
    from_file: IO[str] | None,
    as_json: bool,
) -> None:
    """Produce dead letters' original records again, to their source topic with their key
    (optionally edited). A record that fails again comes back with its redrive count."""
    if edit and from_file is not None:
        raise click.UsageError("--edit or --from-file, not both")
    if from_file is not None and len(letter_ids) != 1:
        raise click.UsageError("--from-file replaces one record: give one PARTITION:OFFSET")
    settings, codec = Settings().with_bootstrap(bootstrap), Codec.default()
    entries = read_letters(settings, namespace)
    # Every edit first: an editor closed without saving sends nothing at all.
    todo = []
    for text in letter_ids:
        entry = find(entries, text)
        letter = entry.letter
        if letter is None or letter.value is None:
            why = entry.problem if letter is None else "it keeps no original record"
            raise LetterNotFound(f"dead letter {entry.id} cannot be redriven: {why}")
        value = letter.value
        if from_file is not None:
            value = from_document(_json(from_file.read(), from_file.name), codec)
        elif edit:
            value = _edit(entry.id, letter.value, codec)
        todo.append((entry, letter, value))

    dlq_topic = Topics(namespace).dlq
    config = client_config(settings.bootstrap(), settings.kafka)
    sender = CommandSender(config, settings.send_timeout)
    done = []
    try:
        for entry, letter, value in todo:
            key = _key(value, letter.key, codec)
            n = sender.partitions(letter.source_topic, settings.connect_timeout)
            if n is None:
                raise TopicError(f"{letter.source_topic} does not exist any more")
            partition = letter.partition if key is None else partition_for(key, n)
            count = letter.redrives + 1
            headers = [
                (REDRIVE_HEADER, str(count).encode()),
                (REDRIVE_OF_HEADER, f"{dlq_topic}:{entry.id}".encode()),
            ]
            what = f"the redrive of dead letter {entry.id}"
            sender.send(letter.source_topic, partition, key, value, what, headers)
            done.append(
                {
                    "id": entry.id,
                    "topic": letter.source_topic,
                    "partition": partition,
                    "run_id": letter.run_id,
                    "redrive": count,
                    "edited": value != letter.value,
                }
            )
    finally:
        sender.close(settings.send_timeout)  # raises CommandNotDelivered if Kafka refused one
    if as_json:
        click.echo(json.dumps(done, indent=2))
        return
    for d in done:
        edited = ", edited" if d["edited"] else ""
        click.echo(
            f"redrove dead letter {d['id']} to {d['topic']} partition {d['partition']} "
            f"(redrive {d['redrive']}{edited})"
        )


def _edit(letter_id: str, value: bytes, codec: Codec) -> bytes:
    try:
        doc = to_document(*codec.decode_raw(value))
    except DecodeError as exc:
        raise SchemaError(
            f"dead letter {letter_id} holds no record to edit ({exc}); write one and use "
            "--from-file"
        ) from None
    text = click.edit(json.dumps(doc, indent=2) + "\n", extension=".json")
    if text is None:
        raise click.ClickException(f"dead letter {letter_id} not saved in the editor: no redrive")
    return from_document(_json(text, "the edited record"), codec)


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{what} is not JSON: {exc}") from None


def _key(value: bytes, original: bytes | None, codec: Codec) -> bytes | None:
    """A command is keyed by its run id (an edit may have changed it); else the original key."""
    try:
        record = codec.decode(value)
    except DecodeError:
        return original
    return record.run_id.encode() if isinstance(record, Command) else original
