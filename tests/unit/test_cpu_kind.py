"""The CPU kind read from /proc/cpuinfo and what `auto` runs on each kind (worker/model/cpu_kind.py)."""

from __future__ import annotations

import os

import pytest
import torch

from worker.model.cpu_kind import (
    AUTO_BY_KIND,
    ISA_FLAGS,
    KINDS,
    OTHER,
    UNKNOWN,
    auto_choice,
    cpu_info,
    parse_cpuinfo,
)
from worker.model.loader import resolve_dtype, resolve_precision, resolve_quantization
from worker.model.quant import native_cpu_bfloat16
from worker.model.w4a8 import w4a8_available
from worker.model.w8a8 import w8a8_available

# Abridged /proc/cpuinfo texts of real machines: the fields the parser reads, among others it must skip.
SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu sse2 avx avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16 amx_bf16 avx512_fp16 \
amx_tile amx_int8
bugs\t\t: spectre_v1

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu sse2
"""
GENOA = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512vbmi avx512_vnni
"""
CASCADE_LAKE = """model name\t: Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz
flags\t\t: fpu avx avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni
"""
ROME = """model name\t: AMD EPYC 7R32
flags\t\t: fpu sse4_2 avx avx2 fma
"""
VNNI = "avx512_vnni"
GRAVITON = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm bf16 i8mm
CPU implementer\t: 0x41
"""


@pytest.mark.parametrize(
    ("text", "model", "kind", "flags"),
    [
        (
            SAPPHIRE_RAPIDS,
            "Intel(R) Xeon(R) Platinum 8488C",
            "amx",
            ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8"),
        ),
        (GENOA, "AMD EPYC 9R14 96-Core Processor", "avx512_bf16", ("avx2", "avx512f", "avx512_bf16", VNNI)),
        (CASCADE_LAKE, "Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz", "avx512", ("avx2", "avx512f", VNNI)),
        (ROME, "AMD EPYC 7R32", "avx2", ("avx2",)),
        (GRAVITON, "unknown CPU", OTHER, ()),
        ("", "unknown CPU", UNKNOWN, ()),
    ],
)
def test_sample_cpuinfo_texts_name_their_model_kind_and_flags(text, model, kind, flags):
    info = parse_cpuinfo(text)
    assert (info.model, info.kind, info.flags) == (model, kind, flags)
    assert info.as_dict() == {"model": model, "kind": kind, "flags": list(flags)}
    assert model in info.describe() and f"kind {kind}" in info.describe()


def test_only_the_first_processor_block_counts():
    # the second block of SAPPHIRE_RAPIDS lists almost no flags: reading it would make the CPU "other"
    assert parse_cpuinfo(SAPPHIRE_RAPIDS).kind == "amx"


def test_amx_flags_without_avx512_bf16_are_not_the_amx_kind():
    assert parse_cpuinfo("flags : avx2 avx512f amx_bf16 amx_tile\n").kind == "avx512"


def test_this_machine_is_read_and_its_kind_agrees_with_onednn_on_bfloat16():
    info = cpu_info()
    assert set(info.flags) <= set(ISA_FLAGS)
    if info.kind in ("amx", "avx512_bf16"):
        assert native_cpu_bfloat16()
    elif info.kind in ("avx512", "avx2"):
        assert not native_cpu_bfloat16()


def test_every_kind_has_a_choice_and_unmeasured_kinds_say_so():
    assert set(AUTO_BY_KIND) == {kind for kind, _ in KINDS}
    for kind, choice in AUTO_BY_KIND.items():
        assert choice.quantization in ("none", "int8", "w8a8", "w4a8")
        assert choice.dtype in ("float32", "bfloat16")
        assert choice.measured or choice.basis.startswith("not measured"), kind
    for kind in (OTHER, UNKNOWN, "riscv"):
        assert not auto_choice(kind).measured and auto_choice(kind).quantization == "none"


def test_auto_on_amx_serves_bfloat16_weights():
    assert resolve_quantization("auto", "cpu", "amx") == "none"
    assert resolve_dtype("auto", "cpu", "none", "amx") == "bfloat16"


def test_auto_on_avx512_bf16_serves_w8a8_between_bfloat16_layers_where_the_kernels_run():
    quantization = resolve_quantization("auto", "cpu", "avx512_bf16")
    assert quantization == ("w8a8" if w8a8_available(torch.device("cpu")) else "none")
    assert resolve_dtype("auto", "cpu", quantization, "avx512_bf16") == "bfloat16"
    assert auto_choice("avx512_bf16").measured


def test_auto_on_avx2_serves_w4a8_on_gguf_blocks_else_w8a8_with_float32_where_the_kernels_run():
    """(tests/engine/test_quant.py has which model directories count as having their 4-bit blocks.)"""
    model = "models/SmolLM2-135M-Instruct"
    if not os.path.exists(f"{model}/model.gguf"):
        pytest.skip("model not fetched (make model)")
    w8a8 = "w8a8" if w8a8_available(torch.device("cpu")) else "none"
    quantization = resolve_quantization("auto", "cpu", "avx2", model)
    assert quantization == ("w4a8" if w4a8_available(torch.device("cpu")) else w8a8)
    assert resolve_quantization("auto", "cpu", "avx2") == w8a8  # no model directory to read blocks from
    for chosen in (quantization, w8a8):
        assert resolve_dtype("auto", "cpu", chosen, "avx2") == "float32"


def test_auto_on_avx512_without_bf16_serves_w8a8_with_float32_and_says_it_is_unmeasured():
    quantization = resolve_quantization("auto", "cpu", "avx512")
    assert quantization == ("w8a8" if w8a8_available(torch.device("cpu")) else "none")
    assert resolve_dtype("auto", "cpu", quantization, "avx512") == "float32"
    assert not auto_choice("avx512").measured


def test_unmeasured_kinds_ask_onednn_for_the_dtype_and_do_not_quantize():
    assert resolve_quantization("auto", "cpu", OTHER) == "none"
    assert resolve_dtype("auto", "cpu", "none", OTHER) == ("bfloat16" if native_cpu_bfloat16() else "float32")


def test_explicit_settings_and_gpus_are_not_chosen_by_the_cpu_kind():
    assert resolve_quantization("int4", "cpu", "avx512_bf16") == "int4"
    assert resolve_quantization("auto", "cuda:0", "avx2") == "none"
    assert resolve_dtype("float32", "cpu", "none", "amx") == "float32"


def test_resolve_precision_logs_the_cpu_and_why(caplog):
    caplog.set_level("INFO", logger="worker.model.loader")
    dtype, quantization = resolve_precision("auto", "auto", "cpu")
    assert (dtype, quantization) == (
        resolve_dtype("auto", "cpu", resolve_quantization("auto", "cpu")),
        resolve_quantization("auto", "cpu"),
    )
    line = caplog.records[-1].getMessage()
    assert f"dtype {dtype} (WORKER_DTYPE=auto)" in line and cpu_info().describe() in line
    assert auto_choice(cpu_info().kind).basis in line
