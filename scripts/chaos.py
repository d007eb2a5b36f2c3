"""Chaos harness: the async demo killed, stopped and resumed over and over, then checked from its own books.

    python scripts/chaos.py --cycles 100 --out /tmp/chaos          # the full run (docs/reliability.md)
    python scripts/chaos.py --cycles 5 --out /tmp/chaos-short      # the short one (CI runs it)

One run directory of `examples/configs/demo.yaml` (async, its own generator process, a checkpoint every step) lives
through `--cycles` actions in a seeded order, each after the run has made progress since the last one:

    run-kill       SIGKILL of the driver and every process of its session, at a random moment of training
    checkpoint     SIGKILL of the whole session while a checkpoint is being written (tmp_step_N/ exists)
    generator      SIGKILL of one generator process: the run must go on (restarting it) and train 2 more steps
    signal-start   SIGTERM or SIGINT 1-6 s after launch: exit 143 / 130 within 60 s, one `stopped by` line
    signal-train   SIGTERM or SIGINT during training: exit 143 / 130 within 60 s after checkpointing its step

Then one last start trains to `--steps` past the furthest step, and the harness checks: every step logged exactly
once; the final checkpoint's books have no problem, every prompt drawn is trained, dropped with a reason or still
waiting, trained prompts = steps x prompts per step, no prompt range trained twice; every wait ended before its
deadline (a hang is a failure naming what was waited for); no `Traceback` anywhere on the console. It prints a
table of each action's count and outcome and exits 1 when a check fails. Every process it starts is in a session
of its own, and only those sessions are killed.
"""

import argparse
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ACTIONS = ("run-kill", "checkpoint", "generator", "signal-start", "signal-train")
PROGRESS_TIMEOUT_S = 240.0
"""The longest a wait for the run's next checkpoint (or step) may take before it counts as a hang."""
CLEAN_STOP_S = 60.0


class Hang(RuntimeError):
    """A wait ran past its deadline; the message names what was waited for."""


@dataclass
class Tally:
    """What happened so far: each action's count, failures (one line each), the run's starts."""

    done: Counter[str] = field(default_factory=Counter[str])
    failures: list[str] = field(default_factory=list[str])
    starts: int = 0
    generator_restarts_seen: int = 0


def schedule(cycles: int, seed: int) -> list[str]:
    """`cycles` actions in a seeded order: a quarter generator kills, an eighth kills inside a checkpoint write,
    a sixteenth signals at start-up and as many during training (at least one of each), the rest whole-run kills."""
    counts = {
        "generator": max(1, cycles // 4),
        "checkpoint": max(1, cycles // 8),
        "signal-start": max(1, cycles // 16),
        "signal-train": max(1, cycles // 16),
    }
    counts["run-kill"] = max(0, cycles - sum(counts.values()))
    actions = [name for name, count in counts.items() for _ in range(count)]
    random.Random(seed).shuffle(actions)
    return actions[:cycles] if len(actions) > cycles else actions


def session_processes(session_id: int) -> list[int]:
    """Live (non-zombie) processes of a session, read from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session_id and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def kill_session(session_id: int) -> None:
    """SIGKILL every process of the session and wait (30 s at most) until none is left."""
    for pid in session_processes(session_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while session_processes(session_id) and time.monotonic() < deadline:
        time.sleep(0.2)


class Chaos:
    """The run directory, its config and the one run process alive at a time."""

    def __init__(self, out: Path, seed: int) -> None:
        self.out = out
        self.run_dir = out / "run"
        self.log = out / "console.log"
        self.config = out / "run.yaml"
        self.chooser = random.Random(seed + 1)
        self.process: subprocess.Popen[bytes] | None = None
        self.tally = Tally()
        tree = yaml.safe_load((REPO / "examples" / "configs" / "demo.yaml").read_text())
        for key in ("train_path", "validation_path"):
            tree["data"][key] = str(REPO / tree["data"][key])
        tree["ppo"].update(max_num_steps=100_000, val_at_start=False, val_period=0)
        tree["ppo"]["async_ppo"].update(watchdog_timeout_s=120)
        tree["generation"]["max_restarts"] = 1000
        tree["checkpointing"]["save_period"] = 1
        tree["logger"]["console"] = False
        self.tree = tree
        self.config.write_text(yaml.safe_dump(tree))

    # -- the run process --
    def start(self, *overrides: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with self.log.open("ab") as console:
            console.write(f"\n=== start {self.tally.starts + 1}\n".encode())
            console.flush()
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "asyncppo",
                    "train",
                    str(self.config),
                    "--run-dir",
                    str(self.run_dir),
                    *list(overrides),
                ],
                stdout=console,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # the driver and every process Ray starts for it: ended together
            )
        self.tally.starts += 1
        self.console_mark = self.log.stat().st_size

    def running(self) -> subprocess.Popen[bytes]:
        if self.process is None or self.process.poll() is not None:
            self.start()
        assert self.process is not None
        return self.process

    def end(self) -> None:
        if self.process is not None:
            kill_session(self.process.pid)
            self.process.wait()
            self.process = None

    def output_since_start(self) -> str:
        return self.log.read_bytes()[self.console_mark :].decode(errors="replace")

    # -- what the run has done --
    def checkpoints(self) -> list[int]:
        directory = self.run_dir / "checkpoints"
        return (
            sorted(int(path.name.removeprefix("step_")) for path in directory.glob("step_*"))
            if directory.exists()
            else []
        )

    def latest_checkpoint(self) -> int:
        return max(self.checkpoints(), default=0)

    def logged_steps(self) -> list[int]:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        steps = []
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a line cut by a SIGKILL; the resume truncates it
                steps.append(json.loads(line)["step"])
        return steps

    def wait_for(self, what: str, done: Callable[[], bool], timeout: float = PROGRESS_TIMEOUT_S) -> None:
        """Poll `done` until it holds; Hang past `timeout`, RuntimeError when the run exits first."""
        process = self.running()
        deadline = time.monotonic() + timeout
        while not done():
            if process.poll() is not None:
                raise RuntimeError(f"the run exited ({process.returncode}) while waiting for {what}")
            if time.monotonic() > deadline:
                raise Hang(f"no {what} within {timeout:.0f} s")
            time.sleep(0.05)

    def wait_for_new_checkpoint(self) -> None:
        before = self.latest_checkpoint()
        self.wait_for(f"checkpoint after step_{before}", lambda: self.latest_checkpoint() > before)

    def generator_pids(self) -> list[int]:
        """The generator processes placement.json names (it is rewritten with a restarted one's id) that are alive
        in the run's session."""
        assert self.process is not None
        placement = json.loads((self.run_dir / "placement.json").read_text())
        alive = set(session_processes(self.process.pid))
        return [record["pid"] for record in placement if record["role"] == "generator" and record["pid"] in alive]

    # -- the actions --
    def run_kill(self) -> None:
        self.wait_for_new_checkpoint()
        time.sleep(self.chooser.uniform(0.0, 1.5))
        self.end()

    def checkpoint_kill(self) -> None:
        self.wait_for_new_checkpoint()  # past start-up, so the next write is a step's
        directory = self.run_dir / "checkpoints"
        self.wait_for("a checkpoint write (tmp_step_N/)", lambda: any(directory.glob("tmp_step_*")))
        self.end()

    def generator_kill(self) -> None:
        self.wait_for_new_checkpoint()
        pids = self.generator_pids()
        if not pids:
            raise RuntimeError("no generator process found in the run's session")
        victim = self.chooser.choice(pids)
        os.kill(victim, signal.SIGKILL)
        steps = self.logged_steps()
        target = (max(steps) if steps else 0) + 2
        self.wait_for(
            f"step {target} after killing generator pid {victim}", lambda: max(self.logged_steps(), default=0) >= target
        )
        if f", pid {victim} died during step " not in self.output_since_start():
            raise RuntimeError(f"no restart line for generator pid {victim} on the console")
        self.tally.generator_restarts_seen += 1

    def stop_by_signal(self, during_start: bool) -> None:
        stop = self.chooser.choice((signal.SIGTERM, signal.SIGINT))
        if during_start:
            self.end()
            self.start()
            # From 1 s: before that the interpreter has not yet run our code, so no handler of ours can answer.
            time.sleep(self.chooser.uniform(1.0, 6.0))
        else:
            self.wait_for_new_checkpoint()
            time.sleep(self.chooser.uniform(0.0, 1.0))
        process = self.running()
        process.send_signal(stop)
        try:
            status = process.wait(timeout=CLEAN_STOP_S)
        except subprocess.TimeoutExpired:
            raise Hang(f"{stop.name}: the run still ran {CLEAN_STOP_S:.0f} s later") from None
        output = self.output_since_start()
        lines = [line for line in output.splitlines() if line.startswith("stopped by")]
        if status != 128 + stop or len(lines) != 1:
            raise RuntimeError(f"{stop.name}: exit {status}, stop lines {lines!r}; expected {128 + stop} and one line")
        self.end()

    def run_action(self, action: str) -> None:
        if action == "run-kill":
            self.run_kill()
        elif action == "checkpoint":
            self.checkpoint_kill()
        elif action == "generator":
            self.generator_kill()
        else:
            self.stop_by_signal(during_start=action == "signal-start")

    def finish(self, extra_steps: int) -> int:
        """Train to `extra_steps` past the furthest logged step in one last start; returns the final step."""
        self.end()
        final = max(self.logged_steps(), default=0) + extra_steps
        self.start(f"ppo.max_num_steps={final}", f"checkpointing.save_period={final}")
        assert self.process is not None
        try:
            status = self.process.wait(timeout=PROGRESS_TIMEOUT_S + 60 * extra_steps)
        except subprocess.TimeoutExpired:
            raise Hang(f"the last start did not reach step {final}") from None
        if status != 0:
            raise RuntimeError(f"the last start exited {status}")
        self.end()
        return final


def check_books(chaos: Chaos, final: int) -> list[str]:
    """The end-of-run checks (module docstring); one line per one that fails."""
    problems = []
    steps = [step for step in chaos.logged_steps() if step > 0]
    if steps != list(range(1, final + 1)):
        missing = sorted(set(range(1, final + 1)) - set(steps))
        doubled = sorted(step for step, count in Counter(steps).items() if count > 1)
        problems.append(f"steps logged: missing {missing[:10]}, doubled {doubled[:10]}")
    books = json.loads((chaos.run_dir / "checkpoints" / f"step_{final}" / "accounting.json").read_text())
    if books["problems"]:
        problems.append(f"books report problems: {books['problems'][:5]}")
    ranges = sorted((start, end) for start, end in books["trained"])
    overlaps = [(a, b) for a, b in itertools.pairwise(ranges) if b[0] < a[1]]
    if overlaps:
        problems.append(f"prompt ranges trained twice: {overlaps[:5]}")
    trained = sum(end - start for start, end in ranges)
    expected = final * chaos.tree["ppo"]["num_prompts_per_step"]
    if trained != expected:
        problems.append(f"{trained} prompts trained, expected {expected} ({final} steps)")
    dropped = sum(end - start for spans in books["dropped"].values() for start, end in spans)
    waiting = len(books["buffered"]) + len(books["pending"])
    if trained + dropped + waiting != books["next_draw_id"]:
        problems.append(f"lost prompts: {books['next_draw_id']} drawn, {trained} + {dropped} + {waiting} accounted")
    tracebacks = chaos.log.read_text(errors="replace").count("Traceback")
    if tracebacks:
        problems.append(f"{tracebacks} tracebacks on the console ({chaos.log})")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="a new or empty directory")
    parser.add_argument("--final-steps", type=int, default=3, help="steps the last start trains past the furthest")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if any(args.out.iterdir()):
        parser.error(f"--out {args.out} is not empty")
    chaos = Chaos(args.out, args.seed)
    started = time.monotonic()
    actions = schedule(args.cycles, args.seed)
    try:
        for index, action in enumerate(actions, 1):
            cycle_start = time.monotonic()
            try:
                chaos.run_action(action)
                chaos.tally.done[action] += 1
            except (Hang, RuntimeError) as error:
                chaos.tally.failures.append(f"cycle {index} ({action}): {type(error).__name__}: {error}")
                chaos.end()
            print(f"cycle {index}/{len(actions)} {action}: {time.monotonic() - cycle_start:.1f} s", flush=True)
        final = chaos.finish(args.final_steps)
        chaos.tally.failures += check_books(chaos, final)
    except (Hang, RuntimeError) as error:
        chaos.tally.failures.append(f"last start: {type(error).__name__}: {error}")
        final = None
    finally:
        chaos.end()
    print_table(chaos.tally, actions, final, time.monotonic() - started)
    return 1 if chaos.tally.failures else 0


def print_table(tally: Tally, actions: list[str], final: int | None, seconds: float) -> None:
    planned = Counter(actions)
    print("\n| action | planned | done |\n|---|---|---|")
    for action in ACTIONS:
        print(f"| {action} | {planned[action]} | {tally.done[action]} |")
    print(
        f"\n{len(actions)} cycles, {tally.starts} starts of the run, {tally.generator_restarts_seen} generator "
        f"restarts seen on the console (the run went on), final step {final}, {seconds / 60:.1f} min"
    )
    for failure in tally.failures:
        print(f"FAIL {failure}")
    print("result:", "0 failures" if not tally.failures else f"{len(tally.failures)} failures")


if __name__ == "__main__":
    sys.exit(main())
