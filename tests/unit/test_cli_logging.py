"""What the CLI lets through of librdkafka's own log lines."""

from __future__ import annotations

import logging

from runstream.cli.main import cli
from runstream.topics.logs import LOGGER_NAME


def _passes(message: str, level: int = logging.WARNING) -> bool:
    logger = logging.getLogger(LOGGER_NAME)
    record = logger.makeRecord(LOGGER_NAME, level, __file__, 1, message, (), None)
    return logger.isEnabledFor(level) and bool(logger.filter(record))


def test_without_verbose_only_librdkafkas_offset_resets_are_logged():
    assert cli.callback is not None
    cli.callback(verbose=False)
    assert _passes("OFFSET [rdkafka#consumer-3] [thrd:main]: t.journal [0]: offset reset")
    assert not _passes("FAIL [rdkafka#producer-1] [thrd:b1]: Connect to ipv4#127.0.0.1:1 failed")
    assert not _passes("OFFSET [rdkafka#consumer-3] [thrd:main]: fetch position", logging.INFO)
    cli.callback(verbose=True)  # -v: all of them, at every level
    assert _passes("FAIL [rdkafka#producer-1] [thrd:b1]: Connect failed", logging.DEBUG)
    cli.callback(verbose=False)
