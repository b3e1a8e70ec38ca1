"""A trio event loop in a background thread, so synchronous code (benchmarks, tests) can drive
async nodes: start services in it, call async functions in it, stop them."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

import trio

START_TIMEOUT_S = 60.0


class TrioThread:
    def __init__(self) -> None:
        self._ready = threading.Event()
        self.thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True, name="trio-thread")
        self.thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError("the trio thread did not start")

    async def _main(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def run(self, afn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run ``afn(*args)`` in the loop and return its result (exceptions propagate)."""
        return trio.from_thread.run(afn, *args, trio_token=self.token)

    def start(self, run: Callable[..., Awaitable[Any]]) -> tuple[Any, Callable[[float], None]]:
        """Start a service ``run(task_status=...)``; return what it reported and a blocking stop()."""
        scope, done = trio.CancelScope(), threading.Event()

        async def runner(task_status=trio.TASK_STATUS_IGNORED) -> None:
            try:
                with scope:
                    await run(task_status=task_status)
            finally:
                done.set()

        value = self.run(self.nursery.start, runner)

        def stop(grace_s: float = 0.0) -> None:
            """Give the service ``grace_s`` to return by itself, then cancel it."""
            if not done.wait(grace_s):
                trio.from_thread.run_sync(scope.cancel, trio_token=self.token)
            if not done.wait(START_TIMEOUT_S):
                raise RuntimeError("the service did not stop")

        return value, stop

    def close(self) -> None:
        trio.from_thread.run_sync(self._stop.set, trio_token=self.token)
        self.thread.join(START_TIMEOUT_S)
