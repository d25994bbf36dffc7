"""Helper scripts that share a machine: the local SLURM cluster's state folder must be ours before anything in
it is read or killed, and the A/B tool runs a reused checkout only when it is the commit it names."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from keyformer.lab.bench.ab import checkout_problem

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "slurm_local.sh"


def slurm_local(state: Path, command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KEYFORMER_SLURM_DIR": str(state), "KEYFORMER_SLURM_NO_INSTALL": "1"}
    return subprocess.run(["bash", str(SCRIPT), command], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("command", ["status", "stop"])
def test_a_state_folder_others_can_write_is_refused_before_use(tmp_path, command):
    state = tmp_path / "state"
    (state / "run").mkdir(parents=True)
    (state / "run" / "slurmd.pid").write_text(f"{os.getpid()}\n")  # a pid that must never be killed
    state.chmod(0o777)
    r = slurm_local(state, command)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "writable by others (mode 777)" in lines[0], r.stderr
    assert (state / "run" / "slurmd.pid").exists()  # nothing read, killed or removed


def test_a_symlinked_state_folder_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "state").symlink_to(tmp_path / "elsewhere")
    r = slurm_local(tmp_path / "state", "status")
    assert r.returncode == 1 and "not a folder (or a symlink)" in r.stderr


def test_stop_kills_only_the_daemon_its_pid_file_names(tmp_path):
    """A pid file naming a live process that is not that daemon (a reused pid): left alone."""
    state = tmp_path / "state"
    (state / "run").mkdir(parents=True)
    state.chmod(0o700)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (state / "run" / "slurmctld.pid").write_text(f"{sleeper.pid}\n")
        slurm_local(state, "stop")
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_a_reused_ab_checkout_must_be_the_commit_it_names(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", cwd=repo)
    for i in (1, 2):
        (repo / "f.py").write_text(f"x = {i}\n")
        git("add", "f.py", cwd=repo)
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"c{i}", cwd=repo)
    first, second = git("rev-parse", "HEAD~1", cwd=repo), git("rev-parse", "HEAD", cwd=repo)
    tree = tmp_path / "ab" / f"keyformer-{first[:12]}"
    git("worktree", "add", "--detach", str(tree), first, cwd=repo)
    assert checkout_problem(tree, first, repo) is None
    (tree / "f.py").write_text("x = 'edited'\n")
    assert "local changes" in checkout_problem(tree, first, repo)
    git("checkout", "-q", "--", "f.py", cwd=tree)
    git("checkout", "-q", "--detach", second, cwd=tree)  # the folder now holds another commit
    assert checkout_problem(tree, first, repo) == f"its HEAD is {second[:12]}"
    other = tmp_path / "other"
    other.mkdir()
    git("init", "-q", cwd=other)
    (other / "f.py").write_text("x = 1\n")
    git("add", "f.py", cwd=other)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c", cwd=other)
    assert "another repository" in checkout_problem(other, git("rev-parse", "HEAD", cwd=other), repo)
