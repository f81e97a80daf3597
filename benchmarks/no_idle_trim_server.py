"""maskserve without its idle trim, for benchmarks.memory_return's "glibc as it is" variant.

    python -m benchmarks.no_idle_trim_server --model DIR --port 8000   # maskserve's own flags

The app hands freed memory back once the forward passes stop for a while (serving/memory.py's
IdleTrimmer); this runs it with the trimmer idle, so that one run can show what the trim is worth.
"""

from __future__ import annotations

import asyncio
import sys

from maskserve.__main__ import main
from maskserve.serving.memory import IdleTrimmer


async def never_trim(self: IdleTrimmer) -> None:
    await asyncio.Event().wait()  # until cancelled at shutdown, as the real one runs


if __name__ == "__main__":
    IdleTrimmer.run = never_trim  # type: ignore[method-assign]
    sys.exit(main())
