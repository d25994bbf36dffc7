"""Process memory from ``/proc`` (Linux; standard library only, so the kvpress side can use it too).

A peak-RSS increase in a long-lived process depends on what ran before it: glibc keeps freed heap memory
(its mmap threshold rises after the first large free, so later mid-size blocks come from a heap that is not
given back), and a run's increase is then measured from a baseline holding an earlier run's garbage. The same
prefill's increase changes several-fold with the runs before it in one process (``scripts/rss_history.py``,
``results/bench/rss_history.txt``). :func:`start_peak` gives the heap back
(``malloc_trim``) before it resets the high-water mark, so every run starts from the live set."""

from __future__ import annotations

import ctypes
import ctypes.util
import re


def status_mb(key: str) -> float:
    """A ``/proc/self/status`` field in MiB (``VmRSS``, ``VmHWM``, ...); NaN where absent."""
    with open("/proc/self/status") as f:
        m = re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M)
    return int(m.group(1)) / 1024 if m else float("nan")


def reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (Linux >= 4.0); False if not possible here."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def trim_heap() -> bool:
    """Give the C heap's free memory back to the system (glibc's ``malloc_trim(0)``); False where there is
    no such call (another C library)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def start_peak() -> float:
    """Start a peak-RSS measurement: trim the heap, reset the high-water mark, return the RSS (MiB) the
    increase is measured from (``status_mb("VmHWM") - start`` after the run); NaN where the mark cannot be
    reset (the increase would then be over the process's whole life)."""
    trim_heap()
    return status_mb("VmRSS") if reset_peak_rss() else float("nan")
