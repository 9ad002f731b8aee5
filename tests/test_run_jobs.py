"""scripts/run_jobs.py, which runs CI's legs side by side: at most --width jobs at once,
each job's output printed whole (never interleaved), and a failing job fails the run
without stopping the others."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "run_jobs.py"


def run_jobs(tmp_path, *jobs, width=2):
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--width", str(width), "--log-dir", str(tmp_path), *jobs],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_each_log_is_printed_whole_and_a_failure_fails_the_run(tmp_path):
    # "slow" ends only once "after" has run, which can start only once "broken" ended:
    # the order holds however loaded the machine is (up to 30 s of waiting).
    marker = tmp_path / "after-ran"
    result = run_jobs(
        tmp_path,
        f"slow=echo slow-1; for i in $(seq 600); do [ -f {marker} ] && break; sleep 0.05; done;"
        " echo slow-2",
        "broken=echo broken-1; sleep 0.2; echo broken-2; exit 3",
        f"after=echo after-1; touch {marker}",
    )
    assert result.returncode == 1
    out = result.stdout
    assert "=== broken: FAILED (exit 3)" in out and "=== slow: passed" in out
    for name in ("slow", "broken"):  # each job's lines together, under its heading
        heading = out.index(f"=== {name}:")
        assert out.index(f"{name}-1\n{name}-2\n", heading) > heading
    # "after" waited for a free place: it started once "broken" ended, before "slow".
    assert out.index("--- started after") > out.index("=== broken:")
    assert out.index("--- started after") < out.index("=== slow:")


def test_one_at_a_time_keeps_the_order_and_passes(tmp_path):
    result = run_jobs(tmp_path, "a=echo one", "b=echo two", width=1)
    assert result.returncode == 0, result.stdout
    assert result.stdout.index("=== a: passed") < result.stdout.index("--- started b")


def test_a_job_without_a_name_is_refused(tmp_path):
    result = run_jobs(tmp_path, "echo nameless")
    assert result.returncode != 0 and "is not NAME=COMMAND" in result.stderr
