"""What the CPU offers for matrix products, read from its flags, and the precision that follows.

Recent server CPUs multiply bfloat16 (and int8) matrices in hardware: AMX tiles, AVX-512 BF16,
VNNI. Without them bfloat16 is emulated by converting to float32 and back, slower than float32
itself. The operator is told which case holds, at start-up and in ``/info``; nothing is assumed.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

# /proc/cpuinfo's names of the matrix features maskserve reports, most capable first.
MATRIX_FLAGS = ("amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_vnni", "avx_vnni")
# Any of these runs bfloat16 products natively.
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
CPUINFO = "/proc/cpuinfo"


def read_flags(path: str = CPUINFO) -> frozenset[str]:
    """The first processor's flags in ``path``; empty where there is no such file (not Linux)."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@cache
def cpu_flags() -> frozenset[str]:
    """This machine's flags, read once: they do not change while the process runs."""
    return read_flags()


def matrix_features(flags: Iterable[str] | None = None) -> tuple[str, ...]:
    """The matrix features among ``flags`` (default: this CPU's), in :data:`MATRIX_FLAGS` order."""
    present = set(cpu_flags() if flags is None else flags)
    return tuple(name for name in MATRIX_FLAGS if name in present)


def native_bf16(flags: Iterable[str] | None = None) -> bool:
    """Whether the CPU multiplies bfloat16 in hardware (AMX or AVX-512 BF16)."""
    return any(name in NATIVE_BF16_FLAGS for name in matrix_features(flags))


def describe_features(flags: Iterable[str] | None = None) -> str:
    """The matrix features, comma-separated, or a plain 'none' for the log and ``/info``."""
    return ", ".join(matrix_features(flags)) or "none (no AMX, AVX-512 BF16 or VNNI)"


def precision_in_effect(dtype: str, device: str, flags: Iterable[str] | None = None) -> str:
    """The precision a forward pass computes in, and on what: what an operator should read first.

    Only bfloat16 on a CPU needs more than its name: it is fast with AMX or AVX-512 BF16 and
    slower than float32 without them.
    """
    if dtype != "bfloat16" or not device.startswith("cpu"):
        return dtype
    features = matrix_features(flags)
    if "amx_bf16" in features:
        return "bfloat16 on AMX"
    if "avx512_bf16" in features:
        return "bfloat16 on AVX-512 BF16"
    return "bfloat16, emulated: this CPU has no AMX or AVX-512 BF16, so it runs slower than float32"


def int8_in_effect(flags: Iterable[str] | None = None) -> str:
    """What an int8 graph's products run on: AMX, VNNI (one instruction per 4-wide dot product),
    or neither, where each product takes several instructions."""
    features = matrix_features(flags)
    if "amx_int8" in features:
        return "int8 on AMX"
    if "avx512_vnni" in features:
        return "int8 on AVX-512 VNNI"
    if "avx_vnni" in features:
        return "int8 on AVX-VNNI"
    return "int8 without VNNI or AMX: each int8 product takes several instructions"
