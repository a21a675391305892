"""Audit a namespace's journal: prove its invariants hold, run by run.

`audit.rules` holds the invariants and is pure (a list of facts is enough; it imports
only ``schemas``); `audit.reader` reads the journal and the dead-letter topic through
the Kafka edge (``topics``) and applies them. The CLI and the tests import it.
"""

from runstream.audit.reader import AuditReport, audit
from runstream.audit.rules import RunCheck, Violation, check_run

__all__ = ["AuditReport", "RunCheck", "Violation", "audit", "check_run"]
