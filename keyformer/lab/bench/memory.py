"""Process memory from ``/proc`` (Linux; standard library only, so the kvpress side can use it too)."""

from __future__ import annotations

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
