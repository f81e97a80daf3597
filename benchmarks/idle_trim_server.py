"""maskserve with an IdleTrimmer on its scheduler's forward passes, for benchmarks.memory_return.

    python -m benchmarks.idle_trim_server --model DIR --port 8000   # maskserve's own flags

The wiring the app is meant to do itself, done from outside so that it can be measured first:
freed memory handed back once when the batch loop starts (after the warm-up), then after every
quiet spell of ``batches_run``.
"""

from __future__ import annotations

import asyncio
import sys

from maskserve.__main__ import main
from maskserve.serving.memory import IdleTrimmer, release_freed_memory
from maskserve.serving.scheduler import Scheduler

_run = Scheduler.run


async def run_with_trimmer(self: Scheduler) -> None:
    await asyncio.get_running_loop().run_in_executor(None, release_freed_memory)
    trimmer = asyncio.create_task(IdleTrimmer(lambda: self.batches_run).run(), name="maskserve-idle-trim")
    try:
        await _run(self)
    finally:
        trimmer.cancel()


if __name__ == "__main__":
    Scheduler.run = run_with_trimmer  # type: ignore[method-assign]
    sys.exit(main())
