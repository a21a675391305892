"""librdkafka's own log lines, through Python logging and rate-limited.

Every client Runstream creates passes the ``runstream.librdkafka`` logger to
librdkafka, so nothing prints raw ``%3|...|FAIL|...`` lines on stderr. librdkafka
repeats itself (a broker that is down is reported every few milliseconds): the filter
lets one line per distinct message through per interval, and the next one that passes
says how many were dropped. The last error is kept, so a `KafkaUnavailable` can name it.

The CLI hides these lines unless ``-v`` is given: Runstream says itself, once per
back-off interval, when Kafka cannot be reached.
"""

from __future__ import annotations

import logging
import re
import threading
import time

LOGGER_NAME = "runstream.librdkafka"
_DIGITS = re.compile(r"\d+")


class RateLimit(logging.Filter):
    """Pass one record per distinct message (digits ignored) per ``interval`` seconds."""

    def __init__(self, interval: float = 60.0) -> None:
        super().__init__()
        self.interval = interval
        self._lock = threading.Lock()
        self._seen: dict[tuple[int, str], tuple[float, int]] = {}  # -> (passed at, dropped)
        self.last_error: str = ""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.levelno >= logging.ERROR:
            self.last_error = message
        key = (record.levelno, _DIGITS.sub("#", message))
        now = time.monotonic()
        with self._lock:
            passed, dropped = self._seen.get(key, (-self.interval, 0))
            if now - passed < self.interval:
                self._seen[key] = (passed, dropped + 1)
                return False
            self._seen[key] = (now, 0)
            if len(self._seen) > 1000:  # distinct messages are few; never grow without bound
                self._seen.clear()
        if dropped:
            record.msg, record.args = f"{message} ({dropped} similar lines dropped)", ()
        return True


_limit = RateLimit()


def kafka_logger() -> logging.Logger:
    """The logger every librdkafka client gets (its level names follow syslog's)."""
    logger = logging.getLogger(LOGGER_NAME)
    if _limit not in logger.filters:
        logger.addFilter(_limit)
    return logger


def last_error() -> str:
    """The last error librdkafka reported in this process ("" if none)."""
    return _limit.last_error
