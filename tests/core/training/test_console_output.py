"""What ``graft train`` prints: whole lines into files and pipes, a progress bar that keeps the
step count and time left in an 80-column terminal, a summary with the wall time, short traces,
and what Ctrl-C before the first checkpoint means for the next run."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

SFT = ("trainer.mode=sft", "model.preset=tiny-llama")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def summary_value(stdout: str, row: str) -> float:
    match = re.search(rf"{re.escape(row)}\s*│\s*([0-9.]+)", stdout)
    assert match, f"no {row!r} row in the summary:\n{stdout}"
    return float(match.group(1))


def test_piped_output_has_one_whole_line_per_step_and_the_wall_time(graft_train, tmp_path: Path,
                                                                     monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # what rich assumes for a pipe anyway
    result = graft_train(tmp_path, *SFT, "trainer.total_steps=3")
    lines = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 3, result.stdout
    for line in lines:
        assert re.fullmatch(r"step +\d  loss \S+  gnorm \S+  lr \S+  tok/s \S+  mem_gib \S+", line), \
            line
    wall, steps = (summary_value(result.stdout, "wall time (s)"),
                   summary_value(result.stdout, "step time (s)"))
    assert wall >= steps > 0


def run_in_terminal(args: list[str], *, columns: int, cwd: Path) -> str:
    """Run ``python -m graft ARGS`` in a pseudo-terminal ``columns`` wide; return what it drew."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES") and not k.startswith("GRAFT_")}
    process = subprocess.Popen([sys.executable, "-m", "graft", *args], stdin=child, stdout=child,
                               stderr=child, env={**env, "TERM": "xterm"}, cwd=cwd)
    os.close(child)
    chunks = []
    while True:
        ready, _, _ = select.select([parent], [], [], 1.0)
        if ready:
            try:
                data = os.read(parent, 65536)
            except OSError:  # the child side is closed: the process is gone
                break
            if not data:
                break
            chunks.append(data)
        elif process.poll() is not None:
            break
    assert process.wait(timeout=60) == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    os.close(parent)
    return b"".join(chunks).decode(errors="replace")


def test_progress_bar_keeps_step_count_and_time_left_in_80_columns(tmp_path: Path) -> None:
    drawn = run_in_terminal(["train", f"trainer.run_dir={tmp_path / 'run'}", *SFT,
                             "trainer.total_steps=6", "checkpoint.every_steps=0"],
                            columns=80, cwd=tmp_path)
    screen_lines = [ANSI.sub("", line) for line in re.split(r"[\r\n]+", drawn)]
    bars = [line for line in screen_lines if re.match(r"step \d/6 ", line)]
    assert bars, drawn[-3000:]
    assert all(len(line.rstrip()) <= 80 for line in bars)
    assert any(re.fullmatch(r"step [1-6]/6 \S+ \d:\d\d:\d\d", line.strip()) for line in bars), bars
    assert any(line.startswith("loss ") and "mem_gib" in line for line in screen_lines), \
        "the latest metrics have their own line under the bar"


def test_traced_hook_calls_summarise_configs_and_large_arguments(run_graft,
                                                                 tmp_path: Path) -> None:
    result = run_graft(["train", f"trainer.run_dir={tmp_path}", *SFT, "trainer.total_steps=1"],
                       env={"GRAFT_TRACE_PLUGINS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    traces = [line for line in result.stderr.splitlines() if line.startswith("[graft.trace]")]
    assert any("graft_pre_shard(model=<LlamaForCausalLM>, cfg=<GraftConfig>," in t for t in traces)
    assert any("metrics=dict(len=" in t for t in traces)
    assert not [line for line in result.stderr.splitlines() if line.startswith(" ")], \
        "a multi-line repr (a whole model or config) leaked into the trace"
    assert max(len(t) for t in traces) < 600


def test_ctrl_c_before_the_first_checkpoint_says_the_next_run_starts_over(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAFT_")}
    run = tmp_path / "run"
    process = subprocess.Popen([sys.executable, "-m", "graft", "train", f"trainer.run_dir={run}",
                                *SFT, "trainer.total_steps=100000", "checkpoint.every_steps=0"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    deadline = time.time() + 120
    while not (run / "metrics.jsonl").is_file() and time.time() < deadline:
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr[-2000:]
    assert ("graft: interrupted; no checkpoint to resume from yet: the next run starts over"
            in stderr), stderr[-2000:]
