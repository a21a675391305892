"""``runstream runs export``: every run the runs read model knows, one row per run, as
JSON lines or Parquet, for a one-off look in a notebook, DuckDB, pandas or a spreadsheet.

One row per run (the read model, the same rows as ``runs list --json``), not one per
lifecycle event: "which runs failed last week, and with what error" is the question
people bring to an export; the event stream itself is for continuous analytics
(``lifecycle_format json``, docs/guides/analytics.md). Parquet is written by DuckDB
(``pip install 'runstream[analytics]'``), with a fixed schema, so an empty export still
has its columns.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import click

from runstream.cli import options
from runstream.cli.options import namespace
from runstream.cli.runs_cmd import cache, caught_up
from runstream.projections.runs import RunQuery, RunRow, RunsModel
from runstream.schemas.records import Status

_PAGE = 1000

#: The Parquet columns, in order (DuckDB types); input and output hold JSON text.
PARQUET_COLUMNS = {
    "run_id": "VARCHAR",
    "workflow": "VARCHAR",
    "version": "VARCHAR",
    "status": "VARCHAR",
    "tags": "MAP(VARCHAR, VARCHAR)",
    "started_at_ms": "BIGINT",
    "updated_at_ms": "BIGINT",
    "ended_at_ms": "BIGINT",
    "duration_ms": "BIGINT",
    "input": "VARCHAR",
    "output": "VARCHAR",
    "error": "VARCHAR",
    "reason": "VARCHAR",
    "code": "VARCHAR",
    "continued_as": "VARCHAR",
    "steps": "BIGINT",
    "events": "BIGINT",
}


def rows(model: RunsModel, query: RunQuery) -> Iterator[RunRow]:
    """Every run matching ``query``, newest first, page by page."""
    after = None
    while True:
        page = model.find(query, _PAGE, after)
        yield from page.runs
        if page.after is None:
            return
        after = page.after


@click.command("export")
@namespace
@options.bootstrap
@click.option(
    "--format", "fmt", type=click.Choice(["jsonl", "parquet"]), default="jsonl", show_default=True
)
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="The file to write (jsonl: standard output when not given; parquet: required).",
)
@click.option("--status", type=click.Choice([s.value for s in Status]), default=None)
@click.option("--workflow", default=None)
@click.option(
    "--since", default=None, help="Started within this long (1h, 2d) or since a UTC time."
)
@cache
@options.json_output
def export(
    namespace: str,
    bootstrap: str | None,
    fmt: str,
    output: Path | None,
    status: str | None,
    workflow: str | None,
    since: str | None,
    cache_dir: Path | None,
    as_json: bool,
) -> None:
    """Every run of NAMESPACE (one row per run, from the runs read model) as JSON lines
    or Parquet, for one-off analysis. With --output and --json, the summary is JSON."""
    if fmt == "parquet" and output is None:
        raise click.UsageError("--format parquet needs --output FILE")
    query = RunQuery(status=status, workflow=workflow, since_ms=options.time_ms(since, "--since"))
    with caught_up(namespace, bootstrap, cache_dir) as (model, _):
        if fmt == "jsonl" and output is None:
            n = _jsonl(rows(model, query), sys.stdout)
        elif fmt == "jsonl":
            assert output is not None
            with output.open("w", encoding="utf-8") as out:
                n = _jsonl(rows(model, query), out)
        else:
            assert output is not None
            n = _parquet(rows(model, query), output)
    if as_json and output is not None:
        options.emit(True, {"runs": n, "format": fmt, "output": str(output)})
    elif output is not None:
        click.echo(f"{n:,} runs written to {output}", err=True)


def _jsonl(runs: Iterator[RunRow], out: IO[str]) -> int:
    n = 0
    for row in runs:
        out.write(json.dumps(row.to_dict(), ensure_ascii=False) + "\n")
        n += 1
    return n


def _parquet(runs: Iterator[RunRow], output: Path) -> int:
    try:
        import duckdb
    except ImportError:
        raise click.ClickException(
            "--format parquet needs DuckDB: pip install 'runstream[analytics]'"
        ) from None
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "runs.jsonl"
        with staged.open("w", encoding="utf-8") as out:
            for row in runs:  # input and output stay JSON text: no one type fits them all
                out.write(json.dumps(dataclasses.asdict(row), ensure_ascii=False) + "\n")
                n += 1
        columns = ", ".join(f"'{k}': '{v}'" for k, v in PARQUET_COLUMNS.items())
        with duckdb.connect() as db:
            db.execute(
                f"COPY (SELECT * FROM read_json(?, format='newline_delimited', "
                f"columns={{{columns}}})) TO '{_quoted(output)}' (FORMAT parquet)",
                [str(staged)],
            )
    return n


def _quoted(path: Path) -> str:
    return str(path).replace("'", "''")
