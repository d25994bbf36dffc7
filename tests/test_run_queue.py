"""The queue scheduler (keyformer-queue, keyformer/lab/queue.py) behind run_points.sh and gpu_studies.sh: its
pick order."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyformer.lab import queue as rq


def test_pick_fewest_done_first_in_queue_order_skipping_locked_failed_and_finished(tmp_path: Path) -> None:
    def write(folder: str, n: int) -> None:
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "predictions.jsonl").write_text("".join(f'{{"id": {i}}}\n' for i in range(n)))

    q1 = tmp_path / "q1.txt"
    q1.write_text("# comment\nm/a 4 policy=h2o\nm/b 4 policy=keyformer\nm/c 4 policy=tova\nm/d 4 "
                  "policy=window\n")
    q2 = tmp_path / "q2.txt"
    q2.write_text("m/e 4 policy=snapkv\n")
    write("m/a", 4)  # finished
    write("m/b", 2)
    write("m/c", 1)
    locks = tmp_path / "locks"
    locks.mkdir()
    queues = [rq.read_queue(q1), rq.read_queue(q2)]
    assert rq.pick(queues, tmp_path, locks, step=1) == ("m/d", 4, ["policy=window"])  # 0 rounds done
    assert rq.pick(queues, tmp_path, locks, step=2)[0] == "m/c"  # c: 1 record, round 0, before d in the file
    assert rq.pick(queues, tmp_path, locks)[0] == "m/b"  # whole points: queue order (a is finished)
    (locks / rq.key("m/d")).mkdir()  # taken by another worker
    assert rq.pick(queues, tmp_path, locks, step=1)[0] == "m/c"
    (locks / f"failed_{rq.key('m/c')}").write_text("trace")
    assert rq.pick(queues, tmp_path, locks, step=1)[0] == "m/b"
    (locks / rq.key("m/b")).mkdir()
    assert rq.pick(queues, tmp_path, locks, step=1)[0] == "m/e"  # then the second queue
    (locks / rq.key("m/e")).mkdir()
    assert rq.pick(queues, tmp_path, locks, step=1) is None



def test_a_copy_keeps_out_of_the_budget_group_another_copy_runs(tmp_path: Path) -> None:
    """share_prompt: the budgets of one point share prompt forwards inside one process, so a copy picks the
    first point whose group (the folder less its budget) no other copy holds; round order still comes first,
    and a copy never idles while a held group has free points."""
    q = tmp_path / "q.txt"
    q.write_text("".join(f"m/s/task={t},budget={b},policy=h2o 4 budget={b}\n" for t in ("x", "y") for b in
                         (0.75, 0.25)))
    locks = tmp_path / "locks"
    locks.mkdir()
    assert rq.group("m/s/task=x,budget=0.75,policy=h2o") == rq.group("m/s/task=x,budget=0.25,policy=h2o") == (
        "m/s/task=x,policy=h2o")
    queues = [rq.read_queue(q)]
    (locks / rq.key("m/s/task=x,budget=0.75,policy=h2o")).mkdir()  # another copy runs x at 0.75
    assert rq.pick(queues, tmp_path, locks)[0] == "m/s/task=y,budget=0.75,policy=h2o"  # not x at 0.25
    for b in (0.75, 0.25):  # y's points have a round done (step 1); x at 0.25 has none
        (tmp_path / f"m/s/task=y,budget={b},policy=h2o").mkdir(parents=True)
        (tmp_path / f"m/s/task=y,budget={b},policy=h2o/predictions.jsonl").write_text('{"id": 0}\n')
    # rounds first: x at 0.25 though another copy holds x's group (and a copy never idles on a held group)
    assert rq.pick(queues, tmp_path, locks, step=1)[0] == "m/s/task=x,budget=0.25,policy=h2o"


def test_malformed_or_missing_queue_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("m/a many policy=h2o\n")
    with pytest.raises(SystemExit, match="malformed queue line"):
        rq.read_queue(bad)
    with pytest.raises(SystemExit, match="no such queue file"):
        rq.read_queue(tmp_path / "nope.txt")


def test_run_points_runs_its_own_checkout_whatever_the_callers_folder(tmp_path: Path) -> None:
    """scripts/run_points.sh called from another folder with relative paths: its workers start in the
    script's checkout (so `python -m` imports that checkout's code), with the queue, ROOT and data paths made
    absolute."""
    import os
    import subprocess

    here = Path(__file__).resolve().parents[1]
    caller = tmp_path / "caller"
    (caller / "q").mkdir(parents=True)
    (caller / "q" / "points.txt").write_text("m/a 1 policy=h2o\n")
    (caller / "root").mkdir()
    (caller / "data").mkdir()
    log = tmp_path / "calls.txt"
    fake = caller / "py.sh"  # a stand-in interpreter: records its folder and arguments
    fake.write_text(f'#!/bin/sh\necho "$(pwd) $KEYFORMER_DATA_DIR $*" >> {log}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PY": "./py.sh", "ROOT": "root", "KEYFORMER_DATA_DIR": "data", "WORKERS": "1"}
    subprocess.run(["bash", str(here / "scripts" / "run_points.sh"), "q/points.txt"], cwd=caller, env=env,
                   check=True, capture_output=True, timeout=60)
    calls = log.read_text().splitlines()
    assert len(calls) == 2  # the stale-lock pass, then one worker
    for call in calls:
        cwd, data, *args = call.split()
        assert (cwd, data) == (str(here), str(caller / "data"))
        assert args[:4] == ["-m", "keyformer.lab.queue", str(caller / "q" / "points.txt"), "--root"]
        assert args[4] == str(caller / "root")
