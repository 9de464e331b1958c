"""What ``graft train`` prints: whole lines into files and pipes; in a terminal (80 and 200
columns), a live display and step lines that fit it, with log messages printed above it; a
summary with the wall time, short traces, and what Ctrl-C before the first checkpoint means for
the next run."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

SFT = ("trainer.mode=sft", "model.preset=tiny-llama")
RL_SMALL = ("rollout.prompts_per_step=4", "rollout.n=4")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def summary_value(stdout: str, row: str) -> float:
    match = re.search(rf"{re.escape(row)}\s*│\s*([0-9.]+)", stdout)
    assert match, f"no {row!r} row in the summary:\n{stdout}"
    return float(match.group(1))


@pytest.mark.slow
def test_piped_output_has_one_whole_line_per_step_and_the_wall_time(graft_train, tmp_path: Path,
                                                                     monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # what rich assumes for a pipe anyway
    result = graft_train(tmp_path, *SFT, "trainer.total_steps=3")
    lines = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 3, result.stdout
    for step, line in enumerate(lines, 1):
        eta = r"  eta \d:\d\d:\d\d" if step < 3 else ""  # the time left, until the last step
        assert re.fullmatch(rf"step {step}/3  loss \S+  gnorm \S+  lr \S+  tok/s \S+  mem_gib \S+{eta}",
                            line), line
    wall, steps = (summary_value(result.stdout, "wall time (s)"),
                   summary_value(result.stdout, "step time (s)"))
    assert wall >= steps > 0


def run_in_terminal(args: list[str], *, columns: int, cwd: Path,
                    module: str = "graft") -> str:
    """Run ``python -m MODULE ARGS`` (``graft`` by default) in a pseudo-terminal ``columns``
    wide; return what it drew."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES") and not k.startswith("GRAFT_")}
    process = subprocess.Popen([sys.executable, "-m", module, *args], stdin=child, stdout=child,
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


def screen_lines(drawn: str) -> list[str]:
    """What a terminal shows of ``drawn``, one entry per line drawn (colours and cursor moves
    removed)."""
    return [ANSI.sub("", line) for line in re.split(r"[\r\n]+", drawn)]


METRIC = r"(loss|reward|mismatch|gnorm|lr|tok/s|mem_gib) -?[0-9][0-9.e+-]*"


@pytest.mark.slow
@pytest.mark.parametrize("columns", [80, 200])
def test_live_display_fits_the_terminal_and_messages_print_above_it(tmp_path: Path,
                                                                    columns: int) -> None:
    drawn = run_in_terminal(["train", f"trainer.run_dir={tmp_path / 'run'}", *RL_SMALL,
                             "trainer.total_steps=3", "checkpoint.every_steps=1",
                             "export.hf_at_end=false"], columns=columns, cwd=tmp_path)
    lines = screen_lines(drawn)
    bars = [line for line in lines if re.match(r"step \d/3 ", line)]
    assert bars and all(len(line.rstrip()) <= columns for line in bars), drawn[-3000:]
    assert any(re.fullmatch(r"step [1-3]/3 \S+ \d:\d\d:\d\d", line.strip()) for line in bars)
    # Step lines and the latest metrics under the bar: whole "label value" pairs, no wrapping.
    step_lines = [line for line in lines if re.match(r"step \d  ", line)]
    status = [line for line in lines if line.startswith("loss ")]
    assert len(step_lines) == 3 and status, drawn[-3000:]
    for line in step_lines + status:
        assert len(line) < columns, line
        assert re.fullmatch(rf"(step \d  )?{METRIC}(  {METRIC})*", line.rstrip()), line
    if columns == 200:
        assert all("mismatch" in line and "mem_gib" in line for line in step_lines), step_lines
    # Each "saved checkpoint" starts a line of its own (was drawn over by the bar:
    # "mem_gib 0.5339saved checkpoint ...").
    saved = [m.start() for m in re.finditer("saved checkpoint", drawn)]
    assert len(saved) == 3, drawn[-3000:]
    assert all(drawn[:at].endswith(("\n", "\r", "\x1b[2K")) for at in saved), \
        [drawn[at - 40:at + 20] for at in saved]


SHOW = """
import sys
from pathlib import Path

from graft.training.metrics import MetricsLog, console_print

with MetricsLog(Path(sys.argv[1]), total_steps=2, enabled=True) as log:
    log.log({"step": 1, "loss": 1.5}, print_line=False)
    console_print("a message for the user")
    log.log({"step": 2, "loss": 0.5}, print_line=False)
"""


def test_console_print_writes_above_the_live_display(tmp_path: Path) -> None:
    (tmp_path / "show_message.py").write_text(SHOW)
    drawn = run_in_terminal([str(tmp_path)], columns=80, cwd=tmp_path, module="show_message")
    at = drawn.index("a message for the user")
    assert drawn[:at].endswith(("\n", "\r", "\x1b[2K")), drawn[at - 80:at + 40]
    assert re.search(r"step \d/2 ", ANSI.sub("", drawn[at:])), "the display is drawn below it"


@pytest.mark.slow
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


@pytest.mark.slow
def test_ctrl_c_before_the_first_checkpoint_says_the_next_run_starts_over(live_graft,
                                                                          tmp_path: Path) -> None:
    run = live_graft(["train", f"trainer.run_dir={tmp_path / 'run'}", *SFT,
                      "trainer.total_steps=100000", "checkpoint.every_steps=0"], cwd=tmp_path)
    run.wait_for(r"^step +1/")  # training is under way: the run said so
    run.interrupt()  # Ctrl-C
    assert run.finish() == 130, run.output[-2000:]
    assert ("graft: interrupted; no checkpoint to resume from yet: the next run starts over"
            in run.output), run.output[-2000:]
