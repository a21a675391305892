"""`runstream audit -n NAMESPACE`: check a namespace's whole journal; exit 1 on a violation."""

from __future__ import annotations

import sys

import click

from runstream.audit import audit as run_audit
from runstream.cli import exits, options
from runstream.settings import Settings


@click.command()
@options.namespace_compat
@options.bootstrap
@click.option(
    "--expect-finished",
    is_flag=True,
    help="Every run must have finished: a suspended run is a violation too.",
)
@options.json_output
def audit(namespace: str, bootstrap: str | None, expect_finished: bool, as_json: bool) -> None:
    """Read NAMESPACE's journal and dlq and check every run's invariants.

    One fact settles each step, timer and signal wait, at most once; sequence
    numbers have no gaps; a finished run has one terminal fact and nothing after
    it; every record is on its run's partition; every dead run is on the dlq;
    an unfinished run waits for something. And the engine's transactions: none it
    gave up (aborted) is visible, none is torn across partitions, no transaction
    sequence number is used twice or lost. Exits 1 if anything is violated.

    The namespace as an argument (audit NAMESPACE) still works, deprecated: use -n.
    """

    def progress(facts: int, seconds: float) -> None:
        click.echo(f"... {facts:,} facts in {seconds:.1f}s", err=True)

    s = Settings().with_bootstrap(bootstrap)
    report = run_audit(
        s.bootstrap(), namespace, expect_finished=expect_finished, progress=progress, kafka=s.kafka
    )
    if as_json:
        options.emit(True, report.to_dict())
    else:
        click.echo(
            f"namespace {namespace}: {report.runs:,} runs, {report.facts:,} facts in "
            f"{report.seconds:.1f}s ({report.facts_per_second:,.0f} facts/s)"
        )
        for status, n in sorted(report.statuses.items()):
            click.echo(f"  {status}: {n:,}")
        click.echo(
            f"  step recoveries after a crash: {report.recovered.total():,}; "
            f"dlq records: {report.dead_letters:,}"
        )
        click.echo(
            f"  engine transactions visible: {report.transactions:,}; "
            f"named aborted: {report.aborted_transactions:,}"
        )
        if report.ok:
            click.echo("OK: no violations")
        else:
            click.echo(f"{len(report.violations)} VIOLATIONS:")
            for v in report.violations:
                click.echo(f"  {v}")
    if not report.ok:
        sys.exit(exits.NO)
