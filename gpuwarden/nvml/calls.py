"""Calling NVML: error names, error counting, and per-device support memory.

Every NVML call in gpuwarden goes through ``Caller.call`` so that an unsupported reading is asked
once and then skipped, a failing one is counted by (call, error) for
``gpuwarden_nvml_errors_total``, and a lost GPU is recognised in one place.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

T = TypeVar("T")

#: NVML return code -> snake_case name ("not_supported", "gpu_is_lost", ...), from pynvml's NVML_ERROR_*.
ERROR_NAMES: dict[int, str] = {
    code: name.removeprefix("NVML_ERROR_").lower()
    for name, code in vars(pynvml).items()
    if name.startswith("NVML_ERROR_") and isinstance(code, int)
}

# Codes that mean "this device will never answer this call": stop asking.
_UNSUPPORTED = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
}
_LOST = {pynvml.NVML_ERROR_GPU_IS_LOST}


def error_name(exc: BaseException) -> str:
    """Return the snake_case NVML error name of ``exc`` (an NVMLError), else the exception's class name."""
    code = getattr(exc, "value", None)
    if isinstance(code, int) and code in ERROR_NAMES:
        return ERROR_NAMES[code]
    return type(exc).__name__


def decode(value: Any) -> str:
    """Return ``value`` as str: pynvml returns bytes or str depending on the call and version."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class GpuLost(Exception):
    """NVML answered NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus or needs a reset."""


class Caller:
    """Calls NVML functions for one device (or the system) and records what went wrong.

    ``unsupported`` holds the names of calls that answered NOT_SUPPORTED / NO_PERMISSION /
    FUNCTION_NOT_FOUND; they are not asked again. ``errors`` is shared across devices and counts
    other failures by (call name, error name). ``failing`` holds this device's calls whose last attempt failed
    otherwise (call name -> error name), until one succeeds.
    """

    def __init__(self, errors: Counter[tuple[str, str]]) -> None:
        self.errors = errors
        self.unsupported: set[str] = set()
        self.failing: dict[str, str] = {}

    def call(self, name: str, fn: Callable[..., T], *args: Any, quiet: frozenset[int] = frozenset()) -> T | None:
        """Return ``fn(*args)``, or None when it is unsupported or failed.

        Raises GpuLost on NVML_ERROR_GPU_IS_LOST. Codes in ``quiet`` return None without being
        counted (for example NOT_FOUND from nvmlDeviceGetSamples, which means "no new sample").
        """
        if name in self.unsupported:
            return None
        try:
            answer = fn(*args)
        except pynvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in _LOST:
                raise GpuLost(name) from exc
            if code in quiet:
                return None
            if code in _UNSUPPORTED:
                self.unsupported.add(name)
                if code == pynvml.NVML_ERROR_NO_PERMISSION:
                    self.errors[(name, error_name(exc))] += 1
                self.failing.pop(name, None)
                return None
            self.errors[(name, error_name(exc))] += 1
            self.failing[name] = error_name(exc)
            return None
        if self.failing:
            self.failing.pop(name, None)
        return answer


def field_value(fv: Any) -> float | int | None:
    """Return the number held by one nvmlFieldValue_t according to its valueType, None if unknown (or a double
    that is NaN or infinite)."""
    vt, v = fv.valueType, fv.value
    if vt == pynvml.NVML_VALUE_TYPE_DOUBLE:
        d = float(v.dVal)
        return d if math.isfinite(d) else None
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return int(v.uiVal)
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return int(v.ulVal)
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        return int(v.ullVal)
    if vt == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return int(v.sllVal)
    if vt == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return int(v.siVal)
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT:
        return int(v.usVal)
    return None
