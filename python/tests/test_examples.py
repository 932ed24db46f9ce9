"""The Python examples run, briefly, and find no torn row.

``examples/python/threads.py`` and ``processes.py`` are run as a user would run them
(a fresh interpreter each), with small settings: a buffer small enough to wrap around
many times in the run, so that learners read rows while collectors overwrite the rows
beside them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "python"
SMALL = ["--seconds", "2", "--capacity", "5000", "--envs", "10", "--steps", "10", "--batch", "64"]


def run_example(script: str, *args: str) -> tuple[str, int]:
    """The example's output and process id, once it exited 0."""
    with subprocess.Popen(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=EXAMPLES,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{out}\n{err}"
        return out, proc.pid


def torn_and_checked(out: str) -> tuple[int, int]:
    m = re.search(r"^torn rows: (\d+) of ([\d,]+) checked$", out, re.MULTILINE)
    assert m, f"no torn-row count in the output:\n{out}"
    return int(m.group(1)), int(m.group(2).replace(",", ""))


@pytest.mark.parametrize("collectors, learners", [(1, 1), (2, 2)])
def test_threads_example_finds_no_torn_row(collectors, learners):
    out, _ = run_example(
        "threads.py", "--collectors", str(collectors), "--learners", str(learners), *SMALL
    )
    torn, checked = torn_and_checked(out)
    assert checked > 0
    assert torn == 0


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="shared regions checked under /dev/shm"
)
def test_processes_example_finds_no_torn_row_and_removes_its_region():
    out, pid = run_example("processes.py", "--collectors", "2", "--learners", "1", *SMALL)
    torn, checked = torn_and_checked(out)
    assert checked > 0
    assert torn == 0
    assert "shared region removed" in out
    assert not os.path.exists(f"/dev/shm/replaybuf.example-processes-{pid}")


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="shared regions' rate limits need futexes"
)
@pytest.mark.parametrize("script", ["threads.py", "processes.py"])
def test_the_examples_hold_their_learners_to_a_replay_ratio(script):
    # Half a sampled row per written row: far below what these learners draw when
    # nothing holds them back (several rows per written row here).
    out, _ = run_example(script, "--collectors", "2", "--learners", "1", "--ratio", "0.5", *SMALL)
    torn, checked = torn_and_checked(out)
    assert checked > 0 and torn == 0
    m = re.search(r"^sampled rows per written row: ([\d.]+) \(held to 0.5\)$", out, re.M)
    assert m, out
    assert abs(float(m.group(1)) - 0.5) <= 0.05, out


def test_the_apex_example_runs_on_a_local_ray_at_its_replay_ratio():
    pytest.importorskip("ray")
    pytest.importorskip("gymnasium")
    out, _ = run_example("apex_ray.py", "--updates", "1000", "--collectors", "2")
    m = re.search(r"^(\d+) rows collected, (\d+) sampled: ([\d.]+) per row$", out, re.MULTILINE)
    assert m, f"no final line:\n{out}"
    collected, sampled = int(m.group(1)), int(m.group(2))
    assert sampled == 1000 * 64
    # Held by the rate limit: diff = 8 * collected - sampled stays in the band 8,000
    # (1,000 rows * 8) +- 256 (4 batches of 64), overshot by at most one call: an
    # extend of 64 rows (+512) or a sample of 64.
    diff = 8 * collected - sampled
    assert 8000 - 256 - 64 <= diff <= 8000 + 256 + 64 * 8, out
    assert len(re.findall(r"^collector eps", out, re.MULTILINE)) == 2
