"""Log lines as JSON objects (``--log-format json``), one per line, for log pipelines.

Each line has ``ts`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``, plus
``run_id`` and ``trace_id`` when the log call gives them (``extra={"run_id": ...}``)
and ``exc`` with the traceback of a logged exception.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

#: Attributes of a log record copied to its line when the log call set them.
FIELDS = ("run_id", "trace_id")


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def use_json_logs() -> None:
    """Format every line of the root logger's handlers as JSON (after basicConfig)."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig()
    for handler in root.handlers:
        handler.setFormatter(JsonFormatter())
