"""Dataset loaders: local JSONL (``KEYFORMER_DATA_DIR`` / ``dataset.path``), the HF hub, or the generated
``sample`` and ``needle`` sets.

Every loader returns a list of records ``{id, document, reference}``; conversation datasets (SODA and
its DialogSum stand-in) also carry ``narrative``, ``speakers`` and ``history``; QA datasets with a
``fields.question`` (the L-Eval sets) carry ``question``; a list-valued reference field (LongBench and L-Eval
``answers``) gives ``reference`` = its first element and ``answers`` = the whole list (scored as the best).
Selection is deterministic: the first ``n`` records in file order (``selection: first``, the default),
or a seeded subset without replacement (``selection: random``, ``random.Random(seed).sample``).
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from keyformer.run.data.needle import generate_needle
from keyformer.run.data.prompts import TRUNCATIONS
from keyformer.run.data.sample import generate_sample
from keyformer.run.validate import ConfigError, UserError

DATA_DIR_ENV = "KEYFORMER_DATA_DIR"
# made in keyformer/run/data/ (ruler: essay tasks read a local file)
GENERATED = ("sample", "needle", "ruler")
RULER_TOKENIZERS = ("model", "smollm2")  # dataset.tokenizer of ruler: whose tokens measure its length


class DataError(UserError, ValueError):
    """A dataset cannot be found or read; the message names the path and how to set it."""


def local_path(ds: Mapping[str, Any]) -> Path | None:
    """Local JSONL path for a dataset config: ``dataset.path`` or ``$KEYFORMER_DATA_DIR/<file>``, else
    None."""
    if ds.get("path"):
        return Path(os.path.expanduser(str(ds["path"])))
    root = os.environ.get(DATA_DIR_ENV)
    if root and ds.get("file"):
        return Path(root).expanduser() / str(ds["file"])
    return None


def check_source(ds: Mapping[str, Any]) -> None:
    """Raise DataError early when the configured data cannot be available (missing file, offline hub, no
    source at all)."""
    if ds.get("name") == "ruler":
        _check_ruler_source(ds)
        return
    if ds.get("name") in GENERATED:
        return
    path = local_path(ds)
    if path is not None:
        if path.is_dir():
            raise DataError(f"dataset '{ds.get('name')}': {path} is a directory; dataset.path must name a "
                            f"JSONL "
                            f"file (e.g. {path / str(ds.get('file') or 'data.jsonl')})")
        if not path.is_file():
            how = "dataset.path" if ds.get("path") else f"{DATA_DIR_ENV} (= {os.environ.get(DATA_DIR_ENV)})"
            raise DataError(f"dataset '{ds.get('name')}': local file {path} does not exist; it is set by "
                            f"{how}")
        return
    if not (ds.get("hub") or {}).get("path"):
        raise DataError(f"dataset '{ds.get('name')}' has only a local source: set {DATA_DIR_ENV} to a folder "
                        f"holding "
                        f"{ds.get('file')} or set dataset.path=/path/to/{ds.get('file')}")
    if os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        raise DataError(
            f"dataset '{ds.get('name')}': no local file and the hub is offline; set {DATA_DIR_ENV} to a "
            f"folder "
            f"holding {ds.get('file')} or set dataset.path=/path/to/{ds.get('file')}"
        )


def essay_source(ds: Mapping[str, Any]) -> str:
    """``dataset.essay_source`` of a ruler config; ``file`` when the key is absent (configs written before it
    existed read the essay file)."""
    return str(ds.get("essay_source") or "file")


def _check_ruler_source(ds: Mapping[str, Any]) -> None:
    """DataError when a ruler task with an essay haystack reads an essay file that is not there."""
    from keyformer.run.data.ruler import essay_path, needs_essay

    if not needs_essay(str(ds.get("ruler_task"))) or essay_source(ds) == "generated":
        return
    path = essay_path(str(ds.get("essay_file") or "cnn_dailymail.jsonl"), ds.get("essay_path"))
    if path is None or not path.is_file():
        raise DataError(f"dataset 'ruler': task {ds.get('ruler_task')} needs the essay haystack, local file "
                        f"{path} "
                        f"not found; set dataset.essay_source=generated (no file), {DATA_DIR_ENV} to a "
                        f"folder holding {ds.get('essay_file')}, or dataset.essay_path=/path/to/file.jsonl")


def load_ruler(ds: Mapping[str, Any], n: int | None, model: Mapping[str, Any] | None = None) -> list[dict]:
    """Generate the ``ruler`` records (``keyformer/run/data/ruler.py``). Lengths are counted in the tokens
    of ``dataset.tokenizer``: ``model`` (default) = the run's model node ``model`` (SmolLM2's tokenizer when
    none is given, and for tiny models), ``smollm2`` = SmolLM2's whatever the model."""
    from keyformer.run.data.ruler import (
        essay_path,
        essay_words,
        generate_ruler,
        generated_essay_words,
        needs_essay,
    )
    from keyformer.run.loading import load_tokenizer, smollm2_tokenizer

    task = str(ds["ruler_task"])
    essay = None
    if needs_essay(task) and essay_source(ds) == "generated":
        essay = generated_essay_words(int(ds["length"]))  # the search never needs more words than tokens
    elif needs_essay(task):
        _check_ruler_source(ds)
        path = essay_path(str(ds.get("essay_file") or "cnn_dailymail.jsonl"), ds.get("essay_path"))
        try:
            essay = essay_words(str(path), str(ds.get("essay_field") or "article"))
        except UnicodeDecodeError as e:
            raise not_utf8(Path(str(path)), e) from None
    count = max(n or 0, int(ds.get("n", 100)))
    which = str(ds.get("tokenizer") or "model")
    tok = load_tokenizer(model) if which == "model" and model is not None else smollm2_tokenizer()
    from keyformer.run.data.ruler import RulerError

    try:
        return generate_ruler(task, int(ds["length"]), count, tok, int(ds.get("seed", 0)), essay)
    except RulerError as e:  # a length too short for the task: one line naming the key
        raise ConfigError(f"dataset.{e.key}", ds.get(e.key), str(e)) from None


def data_files(ds: Mapping[str, Any]) -> dict[str, Path]:
    """The local files the dataset config ``ds`` reads (``{file name: path}``): the JSONL of a local dataset,
    the essay file of a ruler task with an essay haystack; none for generated sets and hub data."""
    if ds.get("name") == "ruler":
        from keyformer.run.data.ruler import essay_path, needs_essay

        if not needs_essay(str(ds.get("ruler_task"))) or essay_source(ds) == "generated":
            return {}
        path = essay_path(str(ds.get("essay_file") or "cnn_dailymail.jsonl"), ds.get("essay_path"))
    elif ds.get("name") in GENERATED:
        return {}
    else:
        path = local_path(ds)
    return {path.name: path} if path is not None and path.is_file() else {}


def not_utf8(path: Path, e: UnicodeDecodeError, line: int | None = None) -> DataError:
    """The one-line error of a file that is not UTF-8 text."""
    where = f", line {line}" if line else ""
    return DataError(f"{path}{where}: not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} at offset "
                     f"{e.start}{' of the line' if line else ''}); save the file as UTF-8 JSONL")


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise not_utf8(path, e, n) from None
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    near = line[max(0, e.pos - 30): e.pos + 30].strip()
                    raise DataError(f"{path}, line {n}, column {e.colno}: invalid JSON: {e.msg} "
                                    f"(near {near!r}); every line must be one JSON object") from None
    return rows


def _read_hub(hub: Mapping[str, Any]) -> list[dict]:
    import datasets  # imported lazily: slow, and unneeded for local data

    d = datasets.load_dataset(str(hub["path"]), hub.get("name"), split=str(hub.get("split", "test")))
    return [dict(r) for r in d]


def _text(v: Any) -> str:
    """Field value as text: lists (e.g. LongBench ``answers``) take their first element."""
    if isinstance(v, list):
        return str(v[0]) if v else ""
    return "" if v is None else str(v)


_TAG = re.compile(r"^\s*(#[^#]+#)\s*:\s*")


def _turns(dialogue: Any, speakers: Any) -> tuple[list[str], list[str]]:
    """Normalise a dialogue to (turns, per-turn speakers); DialogSum hub strings carry ``#PersonN#:`` tags."""
    if isinstance(dialogue, str):
        turns, spk = [], []
        for line in dialogue.splitlines():
            if line.strip():
                m = _TAG.match(line)
                spk.append(m.group(1) if m else "")
                turns.append(line[m.end():] if m else line.strip())
        return turns, spk
    return [str(t) for t in dialogue], [str(s) for s in (speakers or [])]


def _conversation(raw: Mapping[str, Any], fields: Mapping[str, str], context_turns: int) -> dict:
    turns, spk = _turns(raw.get(fields.get("dialogue", "dialogue")),
                        raw.get(fields.get("speakers", "speakers")))
    unique = list(dict.fromkeys(s for s in spk if s)) or ["Person A", "Person B"]
    if len(unique) < 2:
        unique.append("Person B")
    k = max(1, min(context_turns, len(turns) - 1))
    narrative = (_text(raw.get(fields.get("narrative", "narrative"))
                       or raw.get(fields.get("reference", "summary"))))
    return {
        "document": narrative,
        "narrative": narrative,
        "speakers": unique[:2],
        "history": turns[:k],
        "reference": " ".join(turns[k:]),
    }


def _require(raw: Any, i: int, ds: Mapping[str, Any], keys: list[str]) -> None:
    """DataError naming record ``i`` (0-based, in file order) and the first of ``keys`` it lacks."""
    if not isinstance(raw, Mapping):
        raise DataError(f"dataset '{ds['name']}': record {i + 1} is {type(raw).__name__}, not a JSON object")
    for key in keys:
        if key not in raw or raw[key] is None:
            raise DataError(f"dataset '{ds['name']}': record {i + 1} has no field {key!r} (its fields: "
                            f"{', '.join(map(str, raw)) or 'none'}); set dataset.fields to the file's names")


def _to_record(raw: Mapping[str, Any], i: int, ds: Mapping[str, Any], fields: Mapping[str, str]) -> dict:
    if ds.get("task") == "conversation":
        _require(raw, i, ds, [fields.get("dialogue", "dialogue")])
    else:
        _require(raw, i, ds, [fields["document"], fields["reference"]])
    rid = raw.get(fields.get("id", "id"))
    rec: dict[str, Any] = {"id": str(rid) if rid is not None else f"{ds['name']}-{i:05d}"}
    if ds.get("task") == "conversation":
        rec.update(_conversation(raw, fields, int(ds.get("context_turns", 1))))
    else:
        rec["document"] = _text(raw.get(fields["document"]))
        ref = raw.get(fields["reference"])
        rec["reference"] = _text(ref)
        if isinstance(ref, list):
            rec["answers"] = [str(a) for a in ref]
        if fields.get("question"):
            rec["question"] = _text(raw.get(fields["question"]))
    return rec


def _select(rows: list, n: int | None, selection: str, seed: int) -> list:
    if n is None or n >= len(rows):
        return rows
    if selection == "random":
        idx = sorted(random.Random(seed).sample(range(len(rows)), n))
        return [rows[i] for i in idx]
    return rows[:n]


def load_records(ds: Mapping[str, Any], n: int | None = None, seed: int = 0,
                 model: Mapping[str, Any] | None = None) -> list[dict]:
    """Load, normalise and select records for the dataset config ``ds`` (the Hydra ``dataset`` node);
    ``model`` (the run's model node) gives generated datasets that count tokens (``ruler``) their
    tokenizer."""
    if ds["name"] == "sample":
        count = max(n or 0, int(ds.get("n_records", 16)))
        rows = (generate_sample(count, seed=int(ds.get("seed", 0)),
                                n_paragraphs=int(ds.get("n_paragraphs", 8))))
        return _select(rows, n, str(ds.get("selection", "first")), seed)
    if ds["name"] == "ruler":
        return _select(load_ruler(ds, n, model), n, str(ds.get("selection", "first")), seed)
    if ds["name"] == "needle":
        rows = (generate_needle(list(ds["lengths"]), list(ds["depths"]), int(ds["n_values"]),
                                int(ds.get("seed", 0))))
        return _select(rows, n, str(ds.get("selection", "first")), seed)
    check_source(ds)
    path = local_path(ds)
    if path is not None:
        raw, fields = _read_jsonl(path), ds.get("fields") or {}
    else:
        hub = ds.get("hub") or {}
        if not hub.get("path"):
            raise DataError(f"dataset '{ds['name']}' has no hub source; set {DATA_DIR_ENV} or dataset.path")
        raw, fields = _read_hub(hub), hub.get("fields") or ds.get("fields") or {}
    if not raw:
        raise DataError(f"dataset '{ds['name']}': {path or hub.get('path')} holds no records (empty, or "
                        f"blank "
                        "lines only)")
    rows = _select(list(enumerate(raw)), n, str(ds.get("selection", "first")), seed)
    return [_to_record(r, i, ds, fields) for i, r in rows]


def check_count(ds: Mapping[str, Any], records: list, n_samples: Any) -> None:
    """DataError when the dataset has fewer records than ``n_samples`` (an int); ``n_samples=all`` takes
    what there is (metrics.json's ``n_samples`` then counts them)."""
    if isinstance(n_samples, int) and len(records) < n_samples:
        raise DataError(f"dataset '{ds['name']}' has {len(records)} records but n_samples={n_samples}; run "
                        f"the "
                        f"{len(records)} with n_samples=all (or n_samples={len(records)})")


def check_options(ds: Mapping[str, Any]) -> None:
    """Check the dataset keys of the long-context tasks: ``truncation``, ``metrics`` and the ``needle`` grid.

    Raises ConfigError naming the key, the bad value and the valid choices. Absent keys keep the rules
    of the datasets before them (``truncation: end``, ROUGE).
    """
    from keyformer.run.metrics import METRICS

    truncation = ds.get("truncation", "end")
    if truncation not in TRUNCATIONS:
        raise ConfigError("dataset.truncation", truncation,
                          f"allowed: {', '.join(TRUNCATIONS)} (which part of a too-long document is cut)")
    metrics = ds.get("metrics", [])
    if not isinstance(metrics, list | tuple):
        raise ConfigError("dataset.metrics", metrics, f"must be a list of metric names from: "
                                                      f"{', '.join(METRICS)}")
    for m in metrics:
        if m not in METRICS:
            raise ConfigError("dataset.metrics", m, f"unknown metric; allowed: {', '.join(METRICS)}")
    if "accuracy" in metrics and ds.get("name") not in GENERATED:
        raise ConfigError("dataset.metrics", "accuracy",
                          f"needs records with an answer word (the generated datasets: "
                          f"{', '.join(GENERATED)}); "
                          "for QA datasets use token_f1 or exact_match")
    if ds.get("name") == "ruler":
        from keyformer.run.data.ruler import TASKS as RULER_TASKS

        if ds.get("ruler_task") not in RULER_TASKS:
            raise ConfigError("dataset.ruler_task", ds.get("ruler_task"), f"allowed: "
                                                                          f"{', '.join(RULER_TASKS)}")
        from keyformer.run.data.ruler import ESSAY_SOURCES

        if essay_source(ds) not in ESSAY_SOURCES:
            raise ConfigError("dataset.essay_source", ds.get("essay_source"),
                              f"the essay haystack; allowed: {', '.join(ESSAY_SOURCES)}")
        if str(ds.get("tokenizer") or "model") not in RULER_TOKENIZERS:
            raise ConfigError("dataset.tokenizer", ds.get("tokenizer"),
                              f"whose tokens measure dataset.length; allowed: {', '.join(RULER_TOKENIZERS)}")
        if "accuracy" in metrics:
            raise ConfigError("dataset.metrics", "accuracy", "ruler records have several answers: use "
                              "string_match_all (RULER's metric) or string_match_part")
        for key, low in (("length", 256), ("n", 1)):
            v = ds.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"dataset.{key}", v, f"must be an integer >= {low}")
    if ds.get("name") == "needle":
        from keyformer.run.data.needle import GridError, check_grid

        for key in ("lengths", "depths"):
            if not isinstance(ds.get(key), list | tuple):
                raise ConfigError(f"dataset.{key}", ds.get(key), "must be a list")
        try:
            check_grid(list(ds["lengths"]), list(ds["depths"]), ds.get("n_values"))  # type: ignore[arg-type]
        except GridError as e:
            raise ConfigError(f"dataset.{e.key}", ds.get(e.key), str(e),
                              message=f"invalid dataset.{e.key}={ds.get(e.key)!r}: {e}") from None
