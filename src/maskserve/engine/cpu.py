"""What the CPU offers for matrix products, read from its flags, and the precision that follows.

Recent server CPUs multiply bfloat16 (and int8) matrices in hardware: AMX tiles, AVX-512 BF16,
VNNI. Without them bfloat16 is emulated by converting to float32 and back, slower than float32
itself, and int8 products take several instructions each. The operator is told which case holds,
at start-up and in ``/info``; nothing is assumed.

oneDNN, under torch's and OpenVINO's CPU kernels, can be held below what the CPU offers with its
own ``ONEDNN_MAX_CPU_ISA`` variable: the kernels then run as on a lesser CPU. The features reported
here are capped the same way, so that they say what really runs (and so that a test run capped at
``AVX2`` on a recent CPU checks what an AVX2-only CPU does).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import cache

# /proc/cpuinfo's names of the matrix features maskserve reports, most capable first.
MATRIX_FLAGS = ("amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_vnni", "avx_vnni")
# Any of these runs bfloat16 products natively.
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
CPUINFO = "/proc/cpuinfo"
# oneDNN's variable, read by the runtimes themselves; read here only to report what they run.
ISA_CAP_VARIABLE = "ONEDNN_MAX_CPU_ISA"
# What each oneDNN ISA level lets through of MATRIX_FLAGS. The levels above the AMX ones (AVX10)
# let everything through, as does an unknown value, which oneDNN ignores.
_ALLOWED_BY_CAP: dict[str, frozenset[str]] = {
    "SSE41": frozenset(),
    "AVX": frozenset(),
    "AVX2": frozenset(),
    "AVX2_VNNI": frozenset({"avx_vnni"}),
    "AVX2_VNNI_2": frozenset({"avx_vnni"}),
    "AVX512_CORE": frozenset(),
    "AVX512_CORE_VNNI": frozenset({"avx512_vnni", "avx_vnni"}),
    "AVX512_CORE_BF16": frozenset({"avx512_bf16", "avx512_vnni", "avx_vnni"}),
    "AVX10_1_512": frozenset({"avx512_bf16", "avx512_vnni", "avx_vnni"}),
    "AVX512_CORE_FP16": frozenset({"avx512_bf16", "avx512_vnni", "avx_vnni"}),
}


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


def isa_cap(value: str | None) -> frozenset[str] | None:
    """The matrix flags a ``ONEDNN_MAX_CPU_ISA`` value lets through; None when it caps nothing."""
    if not value:
        return None
    return _ALLOWED_BY_CAP.get(value.strip().upper())


def capped(flags: Iterable[str], cap: str | None) -> frozenset[str]:
    """``flags`` less the matrix features that an ISA cap of ``cap`` keeps the kernels from using."""
    allowed = isa_cap(cap)
    present = frozenset(flags)
    if allowed is None:
        return present
    return frozenset(name for name in present if name not in MATRIX_FLAGS or name in allowed)


@cache
def cpu_flags() -> frozenset[str]:
    """This machine's flags as the runtimes use them, read once: they do not change while the
    process runs (oneDNN reads its cap once, too)."""
    return capped(read_flags(), os.environ.get(ISA_CAP_VARIABLE))


def isa_cap_in_effect() -> str | None:
    """The ``ONEDNN_MAX_CPU_ISA`` value that hides features of this CPU, for reports; else None."""
    return os.environ.get(ISA_CAP_VARIABLE) if cpu_flags() != read_flags() else None


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


def int8_kernels(flags: Iterable[str] | None = None) -> str:
    """What an int8 graph's products run on: AMX, VNNI (one instruction per 4-wide dot product),
    or neither ('AVX2'), where each product takes several instructions whose 16-bit partial sums
    can overflow."""
    features = matrix_features(flags)
    if "amx_int8" in features:
        return "AMX"
    if "avx512_vnni" in features:
        return "AVX-512 VNNI"
    if "avx_vnni" in features:
        return "AVX-VNNI"
    return "AVX2"


def int8_fast(flags: Iterable[str] | None = None) -> bool:
    """Whether int8 products have hardware of their own here (VNNI or AMX)."""
    return int8_kernels(flags) != "AVX2"


def int8_in_effect(flags: Iterable[str] | None = None) -> str:
    """The int8 kernels in effect, in words for the log and ``/info``; says when int8 is the wrong
    choice (no VNNI or AMX: slower than float32, and further from its answers)."""
    kernels = int8_kernels(flags)
    if kernels != "AVX2":
        return f"int8 on {kernels}"
    return (
        "int8 on AVX2 with the overflow fix: this CPU has no VNNI or AMX, so int8 runs slower than "
        "float32 here and answers further from it; --quantize none is faster and exact"
    )
