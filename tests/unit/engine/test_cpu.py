"""engine/cpu.py: the CPU's matrix features from its flags, and the precision that follows."""

from __future__ import annotations

from pathlib import Path

from maskserve.engine.cpu import (
    capped,
    describe_features,
    int8_fast,
    int8_in_effect,
    int8_kernels,
    isa_cap,
    matrix_features,
    native_bf16,
    precision_in_effect,
    read_flags,
)

SAPPHIRE_RAPIDS = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile"}
ZEN4 = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
SKYLAKE = {"avx2", "avx512f"}


def test_flags_are_read_from_the_first_processor(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512_bf16 amx_tile\n\n"
        "processor\t: 1\nflags\t\t: fpu\n",
        encoding="ascii",
    )
    assert read_flags(str(cpuinfo)) == frozenset({"fpu", "avx2", "avx512_bf16", "amx_tile"})


def test_no_cpuinfo_means_no_flags(tmp_path: Path) -> None:
    assert read_flags(str(tmp_path / "missing")) == frozenset()


def test_matrix_features_are_listed_most_capable_first() -> None:
    assert matrix_features(SAPPHIRE_RAPIDS) == ("amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_vnni")
    assert matrix_features(ZEN4) == ("avx512_bf16", "avx512_vnni")
    assert describe_features(SKYLAKE) == "none (no AMX, AVX-512 BF16 or VNNI)"


def test_bfloat16_is_native_with_amx_or_avx512_bf16_only() -> None:
    assert native_bf16(SAPPHIRE_RAPIDS) and native_bf16(ZEN4)
    assert not native_bf16(SKYLAKE) and not native_bf16({"avx512_vnni", "avx_vnni"})


def test_the_precision_says_what_runs_bfloat16_and_when_it_is_emulated() -> None:
    assert precision_in_effect("bfloat16", "cpu", SAPPHIRE_RAPIDS) == "bfloat16 on AMX"
    assert precision_in_effect("bfloat16", "cpu", ZEN4) == "bfloat16 on AVX-512 BF16"
    emulated = precision_in_effect("bfloat16", "cpu", SKYLAKE)
    assert "emulated" in emulated and "slower than float32" in emulated
    assert precision_in_effect("float32", "cpu", SKYLAKE) == "float32"
    assert precision_in_effect("bfloat16", "cuda:0", SKYLAKE) == "bfloat16"  # the GPU's own units


def test_int8_says_which_units_run_it() -> None:
    assert int8_in_effect(SAPPHIRE_RAPIDS) == "int8 on AMX"
    assert int8_in_effect(ZEN4) == "int8 on AVX-512 VNNI"
    assert int8_in_effect({"avx2", "avx_vnni"}) == "int8 on AVX-VNNI"
    assert int8_in_effect(SKYLAKE).startswith("int8 on AVX2 with the overflow fix")
    # Without VNNI or AMX it says that int8 is the wrong choice, and what to run instead.
    assert "slower than float32" in int8_in_effect(SKYLAKE) and "--quantize none" in int8_in_effect(SKYLAKE)
    assert [int8_kernels(f) for f in (SAPPHIRE_RAPIDS, ZEN4, SKYLAKE)] == ["AMX", "AVX-512 VNNI", "AVX2"]
    assert int8_fast(ZEN4) and not int8_fast(SKYLAKE)


def test_onednn_isa_cap_hides_what_the_kernels_may_not_use() -> None:
    assert capped(SAPPHIRE_RAPIDS, "AVX2") == {"avx2", "avx512f"}
    assert capped(SAPPHIRE_RAPIDS, "avx512_core_vnni") == {"avx2", "avx512f", "avx512_vnni"}
    assert matrix_features(capped(SAPPHIRE_RAPIDS, "AVX512_CORE_BF16")) == ("avx512_bf16", "avx512_vnni")
    assert capped(ZEN4, "AVX2_VNNI") == {"avx2", "avx512f"}  # it cannot add what the CPU lacks
    # No cap, a cap at or above AMX, or a value oneDNN ignores: every feature stays.
    for cap in (None, "", "AVX512_CORE_AMX", "AVX10_2_512_AMX_2", "NOT_AN_ISA"):
        assert isa_cap(cap) is None and capped(SAPPHIRE_RAPIDS, cap) == SAPPHIRE_RAPIDS
    assert int8_kernels(capped(SAPPHIRE_RAPIDS, "AVX2")) == "AVX2"
    assert not native_bf16(capped(SAPPHIRE_RAPIDS, "AVX512_CORE_VNNI"))
