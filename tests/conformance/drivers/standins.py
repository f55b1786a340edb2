"""The minimum stand-ins a runtime built for macOS needs to import on a Linux CPU.

Each one replaces a macOS system facility that the runtime touches at import time or for
telemetry, never anything on the path from a weight file to a parameter or from a parameter to a
token. The conformance suite shows that: the head's parameters are compared with the file after
loading (``common.compare_loaded``) and the backbone's greedy output with the same folder loaded
without a head.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

APPLIED: list[str] = []


class _LibSystem:
    """macOS ``libSystem``: MTPLX's ``route_tape`` (trace timestamps) opens it at import and reads
    the Mach clock. Stand-in: ``mach_continuous_time`` is ``time.monotonic_ns()`` with a 1/1
    timebase; ``sysctlbyname`` (boot session id, for trace files) answers "unknown" (-1)."""

    def mach_timebase_info(self, ref: Any) -> int:
        info = ref._obj
        info.numer, info.denom = 1, 1
        return 0

    class _Clock:
        restype = None

        def __call__(self) -> int:
            return time.monotonic_ns()

    mach_continuous_time = _Clock()

    def sysctlbyname(self, *args: Any) -> int:
        return -1


def libsystem() -> None:
    """Serve ``ctypes.CDLL('/usr/lib/libSystem.B.dylib')`` (and ``find_library('System')``) with
    the clock-only stand-in above; every other library loads as usual."""
    real = ctypes.CDLL

    class CDLL(real):  # type: ignore[misc,valid-type]
        def __new__(cls, name: Any, *a: Any, **kw: Any) -> Any:
            if isinstance(name, str) and "libSystem" in name:
                return _LibSystem()
            return real(name, *a, **kw)

    ctypes.CDLL = CDLL  # type: ignore[misc]
    APPLIED.append("libSystem.B.dylib -> monotonic clock (MTPLX route_tape timestamps)")


def float32_expert_stacks(model: Any) -> int:
    """MLX's CPU build runs ``gather_mm`` (unquantized expert stacks, SwitchGLU) only in float32
    ("[GatherMM::eval] Currently only supports float32"); Apple GPUs run it in any dtype. Upcast
    such stacks in memory, after loading: bf16 -> float32 is exact, so every loaded value is kept
    (the files keep their dtype). Quantized stacks (``gather_qmm``) are left alone. Returns how
    many stacks were upcast."""
    import mlx.core as mx
    import mlx.nn as nn

    count = 0

    def visit(_path: str, m: Any) -> None:
        nonlocal count
        if type(m).__name__ in ("SwitchLinear",) and "scales" not in m and m["weight"].dtype != mx.float32:
            m["weight"] = m["weight"].astype(mx.float32)
            count += 1

    for _ in range(3):  # engines wrap the model (vllm-mlx's MLLM route: ._model)
        if isinstance(model, nn.Module):
            break
        model = getattr(model, "_model", None) or getattr(model, "model", None)
    if isinstance(model, nn.Module):
        model.apply_to_modules(visit)
    if count and "float32 expert stacks" not in " ".join(APPLIED):
        APPLIED.append("float32 expert stacks: unquantized SwitchLinear weights upcast in memory "
                       "(CPU gather_mm is float32-only; bf16->float32 is exact)")
    return count
