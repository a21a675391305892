"""``--log-format json``: one JSON object per log line (`runstream.jsonlog`)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from runstream.jsonlog import JsonFormatter

ROOT = Path(__file__).resolve().parents[2]


def _line(logger: logging.Logger, *args, **kw) -> dict:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        logger.warning(*args, **kw)
    finally:
        logger.removeHandler(handler)
    text = JsonFormatter().format(records[0])
    assert "\n" not in text
    return json.loads(text)


def test_a_line_has_level_logger_message_and_the_run_id_the_call_gives():
    log = logging.getLogger("runstream.test")
    line = _line(log, "step %r of run %s ended late", "charge", "o-1", extra={"run_id": "o-1"})
    assert line["level"] == "WARNING"
    assert line["logger"] == "runstream.test"
    assert line["message"] == "step 'charge' of run o-1 ended late"
    assert line["run_id"] == "o-1"
    assert line["ts"].endswith("+00:00")
    assert "trace_id" not in line and "exc" not in line


def test_a_logged_exception_keeps_its_traceback_on_the_same_line():
    log = logging.getLogger("runstream.test")
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        line = _line(log, "failed", exc_info=True)
    assert "ValueError: boom" in line["exc"] and "Traceback" in line["exc"]


def test_runstream_worker_logs_json_lines_with_the_option(tmp_path):
    """A real `runstream worker --log-format json` (no supervisor; no broker: it logs that
    it is connecting, then waits for Kafka until stopped)."""
    (tmp_path / "shop.py").write_text("import runstream\napp = runstream.App('jsonlogs')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    args = ["worker", "shop:app", "--no-supervise", "--log-format", "json"]
    args += ["--bootstrap", "127.0.0.1:1", "--state-dir", str(tmp_path / "state")]
    with subprocess.Popen(
        [sys.executable, "-m", "runstream", *args],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    ) as proc:
        try:
            assert proc.stderr is not None
            first = json.loads(proc.stderr.readline())
        finally:
            proc.terminate()
            proc.wait(30)
    assert first["logger"] == "runstream.worker" and first["level"] == "INFO"
    assert "connecting" in first["message"]
