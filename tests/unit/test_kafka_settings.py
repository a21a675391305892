"""Extra librdkafka settings: RUNSTREAM_KAFKA (JSON), RUNSTREAM_KAFKA_<KEY>, and --kafka-config
on any command (no broker: a command that only reports its Settings)."""

from __future__ import annotations

import json
import os

import click
from click.testing import CliRunner

from runstream.cli import options
from runstream.settings import Settings, kafka_key_env


def test_one_variable_per_key_wins_over_the_json_and_merges_with_code(monkeypatch):
    monkeypatch.setenv("RUNSTREAM_KAFKA", json.dumps({"sasl.username": "json", "acks": "all"}))
    monkeypatch.setenv("RUNSTREAM_KAFKA_SASL_USERNAME", "ann")
    monkeypatch.setenv("RUNSTREAM_KAFKA_SSL_CA_LOCATION", "/ca.pem")
    assert Settings().kafka == {
        "sasl.username": "ann",
        "acks": "all",
        "ssl.ca.location": "/ca.pem",
    }
    assert Settings(kafka={"sasl.username": "code"}).kafka["sasl.username"] == "code"
    assert kafka_key_env("ssl.ca.location") == "RUNSTREAM_KAFKA_SSL_CA_LOCATION"


@click.command()
@options.bootstrap
def report(bootstrap: str | None) -> None:
    click.echo(json.dumps(Settings().with_bootstrap(bootstrap).kafka))


def test_kafka_config_on_a_command_reaches_its_settings_and_only_while_it_runs(monkeypatch):
    monkeypatch.delenv("RUNSTREAM_KAFKA_SASL_USERNAME", raising=False)
    monkeypatch.setenv("RUNSTREAM_KAFKA_SECURITY_PROTOCOL", "SSL")
    args = ["--kafka-config", "security.protocol=SASL_SSL", "--kafka-config", "sasl.username=a"]
    result = CliRunner().invoke(report, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"security.protocol": "SASL_SSL", "sasl.username": "a"}
    assert os.environ["RUNSTREAM_KAFKA_SECURITY_PROTOCOL"] == "SSL"
    assert "RUNSTREAM_KAFKA_SASL_USERNAME" not in os.environ


def test_kafka_config_that_is_not_key_value_is_a_usage_error():
    result = CliRunner().invoke(report, ["--kafka-config", "security.protocol"])
    assert result.exit_code == 2
    assert "is not KEY=VALUE" in result.output
