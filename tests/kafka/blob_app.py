"""Workflows with large payloads (`runstream.engine.blobs`), for tests in the test process
or in worker processes (``tests.kafka.blob_app:app``; the namespace from
RUNSTREAM_TEST_NS). Each step body appends ``<name> <run> <pid>`` to
RUNSTREAM_TEST_STEP_LOG, so tests count executions across processes exactly.

``RUNSTREAM_TEST_KILL_ONCE=<path>``: the first body of ``big_once`` to return (no file at
``path`` yet) SIGKILLs its engine process a moment later, from another thread: its output
is made and on its way to the transaction that records it."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time

import runstream

MB5 = 5 * 1024 * 1024


def _log(line: str) -> None:
    path = os.environ.get("RUNSTREAM_TEST_STEP_LOG")
    if path:
        with open(path, "a") as f:  # one short write per line: appends do not interleave
            f.write(f"{line} {os.getpid()}\n")


def big_text(seed: str, n: int) -> str:
    """``n`` characters that depend on ``seed`` (compression would not hide their size)."""
    block = hashlib.sha256(seed.encode()).hexdigest()
    return (block * (n // len(block) + 1))[:n]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def make_app(ns: str, bootstrap: str | None = None) -> runstream.App:
    app = runstream.App(ns, bootstrap)

    @app.step
    def enlarge(run: str, text: str) -> str:
        """A 5 MB output made of the (large) input."""
        _log(f"enlarge {run}")
        return big_text(digest(text), MB5)

    @app.workflow
    async def round_trip(ctx: runstream.Context, text: str) -> dict:
        big = await ctx.step(enlarge, ctx.run_id, text)
        return {"input": digest(text), "step": digest(big), "echo": text}

    @app.step
    def big_once(run: str) -> str:
        _log(f"big_once {run}")
        marker = os.environ.get("RUNSTREAM_TEST_KILL_ONCE")
        if marker and not os.path.exists(marker):
            open(marker, "w").close()  # the next process must see it

            def die() -> None:
                time.sleep(0.01)
                os.kill(os.getpid(), signal.SIGKILL)

            threading.Thread(target=die, daemon=True).start()
        return big_text(run, MB5)

    @app.workflow
    async def big_then_signal(ctx: runstream.Context, _: None = None) -> dict:
        big = await ctx.step(big_once, ctx.run_id)
        go = await ctx.wait_for_signal("go")
        return {"step": digest(big), "len": len(big), "go": go}

    @app.workflow
    async def mailbox(ctx: runstream.Context, _: None = None) -> dict:
        """A big update (argument and result) and a big signal."""

        async def stamp(letter: str) -> str:
            return letter.upper()

        ctx.update_handler("stamp", stamp)
        letter = await ctx.wait_for_signal("letter")
        return {"letter": digest(letter)}

    return app


app = make_app(os.environ.get("RUNSTREAM_TEST_NS", "blobs-test"))
