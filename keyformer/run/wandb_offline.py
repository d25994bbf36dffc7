"""Read W&B's offline runs (``WANDB_MODE=offline``) back without network: their config, summary, history and
files, behind the few calls of ``wandb.Api`` that ``keyformer-collect --wandb`` makes.

An offline run is a folder ``wandb/offline-run-<time>-<id>/`` (below each job's ``output_dir``) holding
``run-<id>.wandb``, a record log in LevelDB's log format (32 KiB blocks of chunks with a 7-byte header,
after a 7-byte file header ``:W&B``), whose records are ``wandb_internal_pb2.Record`` messages, and the
logged files under ``files/`` (the sample table: ``files/media/table/*.table.json``).
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_BLOCK, _HEADER = 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: str | Path) -> Iterator[bytes]:
    """The raw records of a ``.wandb`` file, in order."""
    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B run file (header {data[:4]!r}, expected b':W&B')")
    pos, part = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        pos += _HEADER
        if kind == 0 and length == 0:  # zero fill: the end
            break
        chunk = data[pos:pos + length]
        pos += length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            part = chunk
        elif kind == _MIDDLE:
            part += chunk
        elif kind == _LAST:
            yield part + chunk
            part = b""


def _kinds(path: str | Path) -> Iterator[str]:
    from wandb.proto import wandb_internal_pb2 as pb

    for raw in records(path):
        rec = pb.Record()
        rec.ParseFromString(raw)
        yield rec.WhichOneof("record_type")


def is_written(path: str | Path) -> bool:
    """Whether a run file holds its exit record: W&B writes it when the run finishes and closes the file after
    ``finish`` has returned (its service flushes the file on its own time), so until then a reader may see
    nothing of the run."""
    try:
        return "exit" in _kinds(path)
    except (OSError, ValueError):  # not there yet, or not even its header
        return False


def wait_written(path: str | Path, timeout: float = 60.0) -> None:
    """Return once ``is_written(path)``; TimeoutError naming the file after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not is_written(path):
        if time.monotonic() > end:
            raise TimeoutError(f"{path}: W&B did not write the finished run within {timeout:g} s")
        time.sleep(0.05)


def _put(d: dict, item: Any) -> None:
    """Set ``item`` (a protobuf item with ``key`` or ``nested_key`` and ``value_json``) into ``d``."""
    keys = list(item.nested_key) or [item.key]
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = json.loads(item.value_json)


class _File:
    def __init__(self, path: Path):
        self.path = path

    def download(self, root: str | None = None, replace: bool = False) -> Any:
        return open(self.path, encoding="utf-8")  # noqa: SIM115 - the SDK returns an open file too


class OfflineRun:
    """One offline run: ``name``, ``group``, ``id``, ``config``, ``summary``, ``history`` (the logged rows,
    in order) and ``file(path)`` (a logged file, as the SDK's ``Run.file``)."""

    def __init__(self, folder: str | Path):
        from wandb.proto import wandb_internal_pb2 as pb

        self.folder = Path(folder)
        files = sorted(self.folder.glob("run-*.wandb"))
        if not files:
            raise ValueError(f"{folder}: no run-*.wandb file (not an offline W&B run folder)")
        self.name = self.group = self.id = ""
        self.created_at = self.folder.name  # offline-run-<YYYYMMDD_HHMMSS>-<id>: sorts by start
        self.config: dict[str, Any] = {}
        self.summary: dict[str, Any] = {}
        self.history: list[dict[str, Any]] = []
        for raw in records(files[0]):
            rec = pb.Record()
            rec.ParseFromString(raw)
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                self.name, self.group, self.id = rec.run.display_name, rec.run.run_group, rec.run.run_id
                for item in rec.run.config.update:
                    _put(self.config, item)
            elif kind == "config":
                for item in rec.config.update:
                    _put(self.config, item)
            elif kind == "summary":
                for item in rec.summary.update:
                    _put(self.summary, item)
            elif kind == "history":
                row: dict[str, Any] = {}
                for item in rec.history.item:
                    _put(row, item)
                self.history.append(row)
        self.config = {k: v for k, v in self.config.items() if not k.startswith("_")}

    def file(self, path: str) -> _File:
        p = self.folder / "files" / path
        if not p.is_file():
            raise FileNotFoundError(f"{self.folder}: no logged file {path}")
        return _File(p)


def offline_runs(root: str | Path) -> list[OfflineRun]:
    """Every offline run at any depth below ``root``, oldest first."""
    folders = sorted({p.parent for p in Path(root).glob("**/offline-run-*/run-*.wandb")},
                     key=lambda p: p.name)
    return [OfflineRun(f) for f in folders]


class OfflineApi:
    """``wandb.Api`` over the offline runs below ``root``: ``runs(path, filters={"group": g})`` (``path``,
    entity/project, is ignored: offline runs are found by folder)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def runs(self, path: str | None = None, filters: dict[str, Any] | None = None) -> list[OfflineRun]:
        group = (filters or {}).get("group")
        return [r for r in offline_runs(self.root) if group is None or r.group == group]
