"""MkDocs hook: tables generated from the code, so the docs never drift from it.

- ``<!-- settings -->`` becomes the table of every `runstream.settings.Settings` field
  (environment variable, ``runstream worker`` option, default, description).
- The tables after ``<!-- codes: failure -->``, ``<!-- codes: dead-letter -->`` and
  ``<!-- codes: lifecycle -->`` are written by hand (they say when each code is used), and
  the build fails if their first column is not exactly `runstream.errors.Failure`,
  `runstream.schemas.records.Reason` or `runstream.schemas.records.Kind`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from mkdocs.exceptions import PluginError

# `runstream worker` options named otherwise than their field.
_OPTION_OF = {"bootstrap_servers": "bootstrap", "kafka": "kafka_config"}


def _default(field: Any) -> str:
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is None:
        return "none"
    return f"`{json.dumps(value) if isinstance(value, str | dict) else value}`"


def settings_table() -> str:
    from runstream.cli.main import worker
    from runstream.settings import Settings

    options = {p.name: p.opts[0] for p in worker.params if p.opts[0].startswith("--")}
    rows = [
        "| setting | environment, `runstream worker` option | default | what |",
        "|---|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        option = options.get(_OPTION_OF.get(name, name))
        where = f"`RUNSTREAM_{name.upper()}`" + (f"<br>`{option}`" if option else "")
        what = (field.description or "").replace("|", "&#124;")
        rows.append(f"| `{name}` | {where} | {_default(field)} | {what} |")
    return "\n".join(rows)


def _codes() -> dict[str, set[str]]:
    from runstream.errors import Failure
    from runstream.schemas.records import Kind, Reason

    failure = {v for k, v in vars(Failure).items() if k.isupper()}
    return {
        "failure": failure,
        "dead-letter": {r.value for r in Reason},
        "lifecycle": {k.value for k in Kind},
    }


def check_codes(markdown: str, page: str) -> None:
    for name, expected in _codes().items():
        marker = f"<!-- codes: {name} -->"
        if marker not in markdown:
            continue
        table = markdown.split(marker, 1)[1].lstrip("\n")
        seen: set[str] = set()
        for line in table.splitlines()[2:]:
            if not line.startswith("|"):
                break
            seen.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
        if seen != expected:
            raise PluginError(
                f"{page}: the {name} codes table lacks {sorted(expected - seen)} "
                f"and has unknown {sorted(seen - expected)}"
            )


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    check_codes(markdown, page.file.src_uri)
    return markdown.replace("<!-- settings -->", settings_table())
