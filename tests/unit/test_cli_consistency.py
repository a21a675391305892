"""One CLI (issue 25): every command, walked from the click tree (the lazy groups too), takes
the namespace as -n/--namespace, has --json, points at the exit-code table, spells --tag,
--wait and --timeout one way, and says a usage error in one line with exit 2. No broker:
what is checked here is decided before any Kafka call."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from runstream import errors
from runstream.cli import exits, options
from runstream.cli.dlq_cmd import LetterNotFound
from runstream.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]

#: Commands with no namespace option, and why.
NO_NAMESPACE = {
    "worker": "the App's own namespace (MODULE:APP)",
    "sources serve": "the App's own namespace (MODULE:APP)",
    "tasks serve": "the App's own namespace (MODULE:APP)",
    "kafka up": "a local broker, no namespace",
    "kafka down": "a local broker, no namespace",
    "kafka status": "a local broker, no namespace",
    "exit-codes": "a table",
}
#: Commands that talk to no Kafka as a client (so no --kafka-config).
NO_KAFKA = {"kafka up", "kafka down", "kafka status", "workers", "exit-codes"}


def _walk(
    group: click.Group, ctx: click.Context, path: str = ""
) -> Iterator[tuple[str, click.Command]]:
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        full = f"{path} {name}".strip()
        if isinstance(command, click.Group):
            yield from _walk(command, click.Context(command, parent=ctx, info_name=name), full)
        else:
            yield full, command


COMMANDS = dict(_walk(cli, click.Context(cli, info_name="runstream")))


def _opts(command: click.Command) -> dict[str, click.Parameter]:
    return {opt: p for p in command.params for opt in p.opts}


def test_the_walk_finds_the_lazy_groups_commands_and_the_new_ones():
    lazy = ("runs list", "runs cancel", "dlq redrive", "tasks status", "topics create")
    new = ("promise resolve", "cancel", "publish", "signal-with-start", "exit-codes")
    for name in (*lazy, *new):
        assert name in COMMANDS
    assert len(COMMANDS) > 40


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_the_namespace_option_json_and_the_exit_code_table(name):
    command = COMMANDS[name]
    opts = _opts(command)
    assert "--json" in opts, f"{name} has no --json"
    if name not in NO_NAMESPACE:
        assert "-n" in opts and "--namespace" in opts, f"{name}: no -n/--namespace"
        assert opts["-n"] is opts["--namespace"]
    else:
        assert "--namespace" not in opts
    if name not in NO_KAFKA:
        assert "--kafka-config" in opts and "--bootstrap" in opts, f"{name}: no --kafka-config"
    out = CliRunner().invoke(cli, [*name.split(), "--help"])
    assert out.exit_code == exits.OK, out.output
    assert "runstream exit-codes" in out.output, f"{name} --help does not name the table"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_usage_error_is_one_line_on_stderr_and_exit_2(name):
    out = CliRunner().invoke(cli, [*name.split(), "--no-such-option"], prog_name="runstream")
    assert out.exit_code == exits.USAGE == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("UsageError: No such option '--no-such-option'.")
    assert out.stderr.endswith(f"(see 'runstream {name} --help')\n")


def test_a_missing_namespace_or_argument_and_a_bad_value_are_one_line_too():
    for args, says in [
        (["start", "wf"], "Missing option '-n' / '--namespace'"),
        (["start", "-n", "shop"], "Missing argument 'WORKFLOW'"),
        (["start", "wf", "{bad", "-n", "shop"], "not JSON"),
        (["result", "r1", "-n", "shop", "--wait", "soon"], "not a duration: 'soon'"),
        (["runs", "list", "-n", "shop", "--since", "yesterday"], "neither a duration"),
        (["audit"], "Missing option '-n' / '--namespace'"),
        (["topics", "create", "a", "-n", "b"], "two namespaces: -n b and a"),
        (["nosuch"], "No such command 'nosuch'"),
    ]:
        out = CliRunner().invoke(cli, args)
        assert out.exit_code == 2, (args, out.output)
        assert out.stderr.count("\n") == 1 and says in out.stderr, (args, out.stderr)


@pytest.mark.parametrize("name", sorted(n for n, c in COMMANDS.items() if "--tag" in _opts(c)))
def test_tag_is_parsed_by_the_one_helper(name):
    param = _opts(COMMANDS[name])["--tag"]
    assert param.multiple and param.metavar == "KEY=VALUE"
    out = CliRunner().invoke(cli, [*name.split(), "x", "-n", "shop", "--tag", "no-equals"])
    assert out.exit_code == 2 and "'no-equals' is not KEY=VALUE" in out.stderr, out.output


def test_tags_become_a_dict_and_a_value_may_hold_an_equals_sign():
    assert options.parse_tags(("team=pay", "q=a=b", "empty=")) == {
        "team": "pay",
        "q": "a=b",
        "empty": "",
    }
    with pytest.raises(click.BadParameter):
        options.parse_tags(("=v",))


def test_timeout_is_a_runs_time_limit_and_wait_how_long_a_command_waits():
    with_timeout = {n for n, c in COMMANDS.items() if "--timeout" in _opts(c)}
    assert with_timeout == {"start", "signal-with-start"}
    for name, command in COMMANDS.items():
        wait = _opts(command).get("--wait")
        if wait is not None:
            assert isinstance(wait.type, options.Duration), name
    assert _opts(COMMANDS["start"])["--timeout"].type is options.DURATION


def test_one_cancel_takes_run_ids_or_where_and_not_both():
    assert COMMANDS["cancel"] is COMMANDS["runs cancel"]
    for args in (
        ["cancel", "-n", "shop"],
        ["cancel", "r1", "--where", "status=running", "-n", "s"],
    ):
        out = CliRunner().invoke(cli, args)
        assert out.exit_code == 2 and "not both" in out.stderr, out.output
    out = CliRunner().invoke(cli, ["cancel", "r1", "--dry-run", "-n", "shop"])
    assert out.exit_code == 2 and "go with --where" in out.stderr


def test_the_old_positional_namespace_still_works_with_a_warning(monkeypatch):
    monkeypatch.setenv("RUNSTREAM_CONNECT_TIMEOUT", "0.5")
    out = CliRunner().invoke(cli, ["topics", "describe", "shop", "--bootstrap", "127.0.0.1:1"])
    assert "use -n shop" in out.stderr.splitlines()[0]
    assert out.exit_code == exits.KAFKA_UNREACHABLE, out.output  # it went on, as shop
    assert out.stderr.splitlines()[-1].startswith("KafkaUnavailable: ")


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        (errors.RunFailed, exits.NO),
        (errors.RunTimedOut, exits.NO),
        (errors.RunCancelled, exits.NO),
        (errors.UpdateFailed, exits.NO),
        (errors.EventNotSet, exits.NO),
        (errors.KafkaUnavailable, exits.KAFKA_UNREACHABLE),
        (errors.KafkaNotAuthorized, exits.NOT_AUTHORIZED),
        (errors.RunNotFound, exits.NOT_FOUND),
        (LetterNotFound, exits.NOT_FOUND),
        (errors.OwnerUnavailable, exits.TIMED_OUT),
        (TimeoutError, exits.TIMED_OUT),
        (errors.TopicError, exits.ERROR),
        (errors.SchemaError, exits.ERROR),
        (errors.QueryFailed, exits.ERROR),
    ],
)
def test_each_error_has_its_exit_code(kind, code):
    assert exits.code_of(kind.__new__(kind)) == code


def test_the_exit_code_table_is_printed_and_documented():
    assert len({name for name, _ in exits.TABLE.values()}) == len(exits.TABLE)
    assert all(code >= 3 for code in exits.TABLE if code not in (0, 1, 2))
    out = CliRunner().invoke(cli, ["exit-codes", "--json"])
    assert [row["code"] for row in json.loads(out.stdout)] == list(exits.TABLE)
    doc = (ROOT / "docs" / "reference" / "cli.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| `([\w-]+)` \|", doc, re.MULTILINE))
    assert rows == {str(c): n for c, (n, _) in exits.TABLE.items()}


def test_times_are_read_as_utc_and_printed_as_iso_8601_with_z():
    now = 1_700_000_000_000
    assert options.time_ms("2h", "--since", now) == now - 7_200_000
    assert options.time_ms("2023-11-14T22:13:20", "--since", now) == now  # no zone: UTC
    assert options.time_ms("2023-11-14T22:13:20Z", "--since", now) == now
    assert options.time_ms("2023-11-14T23:13:20+01:00", "--since", now) == now
    with pytest.raises(click.BadParameter):
        options.time_ms("yesterday", "--since", now)
    assert options.iso(now) == "2023-11-14T22:13:20Z"
    assert options.iso(now + 5, precise=True) == "2023-11-14T22:13:20.005Z"
