"""An append-only JSONL journal that makes a long benchmark resumable.

Every finished measurement is one line ``{"key": ..., "value": ..., "time": ...}``, written and flushed as
soon as it exists. A rerun with the same output folder reads the lines back and skips what they hold, so a run
that dies after hours loses only the measurement in progress. The first line is a header of everything that
defines the measurements (model, dtype, seed, threads, memory budget options, the code's identity); a rerun
whose header differs is refused with the differing fields named, since its numbers would not be comparable. A
last line cut short by a kill is dropped (and logged).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Journal:
    """``path``: the JSONL file; ``header``: JSON-able dict that a resumed run must match exactly."""

    def __init__(self, path: Path, header: dict[str, Any], log: Callable[[str], None] = print) -> None:
        self.path, self.header, self.entries = Path(path), header, {}
        self.resumed = 0
        if self.path.is_file() and self.path.stat().st_size:
            lines = self.path.read_text().splitlines()
            records = []
            for i, line in enumerate(lines):
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    if i != len(lines) - 1:
                        raise SystemExit(f"{self.path}: line {i + 1} is not JSON (only a last line cut short "
                                         f"by a kill is dropped); fix or delete the file") from None
                    log(f"[journal] {self.path}: dropped a last line cut short ({len(line)} chars)")
                    self.path.write_text("".join(x + "\n" for x in lines[:-1]))
            old = records[0].get("header") if records else None
            if old != json.loads(json.dumps(header)):
                diff = sorted(k for k in {*(old or {}), *header} if (old or {}).get(k) != header.get(k))
                detail = "; ".join(f"{k}: {(old or {}).get(k)!r} there, {header.get(k)!r} now" for k in diff)
                raise SystemExit(f"{self.path} holds a run with other settings ({detail}). Its "
                                 f"measurements would not compare with this run's: give another --out, or "
                                 f"delete the folder to start over.")
            self.entries = {r["key"]: r["value"] for r in records[1:]}
            self.resumed = len(self.entries)
            log(f"[journal] resuming {self.path}: {self.resumed} measurements already done")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._append({"header": header, "time": _now()})

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def get(self, key: str, default: Any = None) -> Any:
        return self.entries.get(key, default)

    def put(self, key: str, value: Any) -> Any:
        """Record ``value`` under ``key`` (flushed to disk before returning); returns ``value``."""
        self.entries[key] = json.loads(json.dumps(value))
        self._append({"key": key, "value": value, "time": _now()})
        return self.entries[key]

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """The journaled value of ``key``, computing and recording it on first use."""
        return self.entries[key] if key in self.entries else self.put(key, compute())

    def check(self, key: str, value: Any, what: str) -> None:
        """Record ``value`` the first time; later runs must see the same (e.g. a hash of the prompts)."""
        old = self.once(key, lambda: value)
        if old != json.loads(json.dumps(value)):
            raise SystemExit(f"{self.path}: {what} changed since this folder was started ({old!r} there, "
                             f"{value!r} now); give another --out, or delete the folder to start over.")

    def _append(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
