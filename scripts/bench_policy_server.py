"""Benchmark the policy server's limits against issue 31's acceptance; prints one table.

    .venv/bin/python scripts/bench_policy_server.py                                  # the acceptance load
    .venv/bin/python scripts/bench_policy_server.py --concurrency 20 --hang-ups 50   # a quick look

Starts `asyncppo gym serve examples/configs/gym_multi_step.yaml` in a subprocess: the shipped demo policy behind the
policy server on 127.0.0.1, as a run serves it (env.gym limits at their defaults), its stderr kept as the server
log. Then, one after another:
- oversized: `--oversized-mib` bodies (Content-Length declared, the bytes streamed by a writer thread while the
  reply is read): seconds to the answer, what the client got to send, the server's RSS before and after;
- health under load: GET /health latency (one prober, one keep-alive connection) while `--concurrency` chat
  completions of `--request-mib` each (one long user message) are served;
- hang-ups: `--hang-ups` clients send the headers and 64 KiB of a 1 MiB body, then close: log lines and tracebacks;
- stop: SIGTERM while `--stop-requests` 1 MiB requests run: seconds to exit, exit status, tracebacks.
`--src DIR` runs the server from another source tree (PYTHONPATH), e.g. a copy of the code before a change.
"""

import argparse
import asyncio
import collections
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).parents[1]
CONFIG = REPO / "examples" / "configs" / "gym_multi_step.yaml"
CHAT = "/v1/chat/completions"
SENTENCE = "The quick brown fox jumps over 12 lazy dogs near the river bank. "


def chat_body(num_bytes: int) -> bytes:
    """A valid chat completion request of about `num_bytes` bytes: one long user message."""
    shell = {"model": "policy", "temperature": 1.0, "top_p": 1.0, "max_tokens": 8}
    overhead = len(json.dumps(shell | {"messages": [{"role": "user", "content": ""}]}))
    text = (SENTENCE * (num_bytes // len(SENTENCE) + 1))[: max(num_bytes - overhead, 1)]
    return json.dumps(shell | {"messages": [{"role": "user", "content": text}]}).encode()


def request_head(port: int, path: str, content_length: int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"host: 127.0.0.1:{port}", "content-type: application/json"]
    return ("\r\n".join([*lines, f"content-length: {content_length}"]) + "\r\n\r\n").encode()


def read_reply(connection: socket.socket) -> int:
    """The status of the reply on `connection` once its head and body are in (or the server closed); 0 if none."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            return 0
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lengths = [int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length")]
    while lengths and len(body) < lengths[0] and (chunk := connection.recv(65536)):
        body += chunk
    return int(head.split()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def oversized(port: int, num_bytes: int, timeout_s: float) -> tuple[float, int, int]:
    """(seconds to the reply, status (0: none within timeout_s), bytes the writer got to send) for one body of
    `num_bytes` bytes streamed while the reply is read."""
    body = chat_body(num_bytes)
    connection = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    sent = [0]

    def write() -> None:
        try:
            connection.sendall(request_head(port, CHAT, len(body)))
            for start in range(0, len(body), 1 << 20):
                sent[0] += connection.send(body[start : start + (1 << 20)])
        except OSError:  # the server closed the connection after its answer: the point of the measurement
            pass

    writer = threading.Thread(target=write, daemon=True)
    start = time.perf_counter()
    writer.start()
    try:
        status = read_reply(connection)
    except (TimeoutError, ConnectionResetError):
        status = 0
    elapsed = time.perf_counter() - start
    connection.close()
    writer.join(timeout_s)
    return elapsed, status, sent[0]


class HealthProber:
    """GET /health on one keep-alive connection, every `interval_s`, until stopped; latencies in seconds (a probe
    without an answer within timeout_s counts as timeout_s and reconnects)."""

    def __init__(self, port: int, interval_s: float, timeout_s: float) -> None:
        self.port, self.interval_s, self.timeout_s = port, interval_s, timeout_s
        self.latencies: list[float] = []
        self.num_timeouts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "HealthProber":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        request = f"GET /health HTTP/1.1\r\nhost: 127.0.0.1:{self.port}\r\n\r\n".encode()
        connection = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout_s)
        while not self._stop.is_set():
            start = time.perf_counter()
            try:
                connection.sendall(request)
                assert read_reply(connection) == 200
                self.latencies.append(time.perf_counter() - start)
            except (TimeoutError, OSError):
                self.num_timeouts += 1
                self.latencies.append(self.timeout_s)
                connection.close()
                connection = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout_s)
            self._stop.wait(self.interval_s)
        connection.close()


async def post_many(
    port: int, body: bytes, count: int, timeout_s: float
) -> tuple[list[float], collections.Counter[str]]:
    """`count` concurrent POSTs of `body`: (seconds each, answers by status or error name)."""
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=timeout_s) as client:

        async def one() -> tuple[float, str]:
            start = time.perf_counter()
            try:
                answer = await client.post(CHAT, content=body, headers=headers)
                outcome = str(answer.status_code)
            except httpx.HTTPError as error:
                outcome = type(error).__name__
            return time.perf_counter() - start, outcome

        results = await asyncio.gather(*(one() for _ in range(count)))
    return [seconds for seconds, _ in results], collections.Counter(outcome for _, outcome in results)


def hang_up(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request_head(port, CHAT, 1 << 20) + b" " * (64 << 10))


class Log:
    """The server's stderr file; `since_mark()` is what it gained after the last `mark()`."""

    def __init__(self, path: Path) -> None:
        self.path, self._offset = path, 0

    def mark(self) -> None:
        self._offset = self.path.stat().st_size

    def since_mark(self) -> str:
        with self.path.open("rb") as file:
            file.seek(self._offset)
            return file.read().decode(errors="replace")


def start_server(args: argparse.Namespace, log_path: Path) -> tuple[subprocess.Popen[str], int]:
    command = [sys.executable, "-m", "asyncppo.cli.main", "gym", "serve", str(CONFIG), "cluster.device=cpu"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"} | ({"PYTHONPATH": str(args.src)} if args.src else {})
    log = log_path.open("w")
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    assert process.stdout is not None
    port = 0
    for line in process.stdout:
        if line.startswith("policy server:"):
            port = int(line.split("127.0.0.1:")[1].split("/")[0])
        if line.strip() == "ready":
            break
    else:
        sys.exit(f"the server exited before it was ready (status {process.wait()}); log: {log_path}")
    threading.Thread(target=process.stdout.read, daemon=True).start()  # drain it: a full pipe would block
    return process, port


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--oversized-mib", type=int, default=64)
    parser.add_argument("--oversized-repeats", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--request-mib", type=float, default=1.0)
    parser.add_argument("--hang-ups", type=int, default=500)
    parser.add_argument("--stop-requests", type=int, default=20)
    parser.add_argument("--probe-interval-s", type=float, default=0.01)
    parser.add_argument("--timeout-s", type=float, default=30.0, help="per probe and per oversized body")
    parser.add_argument("--src", type=Path, help="run the server from this source tree instead")
    args = parser.parse_args()
    rows: list[tuple[str, str, str]] = []
    log_path = Path(tempfile.mkdtemp(prefix="bench_policy_server_")) / "server.log"
    process, port = start_server(args, log_path)
    log = Log(log_path)
    try:
        rss_before = rss_mib(process.pid)
        runs = [oversized(port, args.oversized_mib << 20, args.timeout_s) for _ in range(args.oversized_repeats)]
        seconds = [run[0] * 1000 for run in runs]
        statuses = collections.Counter(run[1] for run in runs)
        rows.append(
            (
                f"{args.oversized_mib} MiB body: reply ms p50 / max",
                f"{statistics.median(seconds):.1f} / {max(seconds):.1f}",
                "< 100",
            )
        )
        rows.append(
            (f"{args.oversized_mib} MiB body: statuses (x{args.oversized_repeats})", dict(statuses).__repr__(), "413")
        )
        rows.append(("  bytes the client got to send, max", f"{max(run[2] for run in runs):,}", "not the body"))
        try:
            answer = httpx.post(
                f"http://127.0.0.1:{port}{CHAT}", content=chat_body(args.oversized_mib << 20), timeout=args.timeout_s
            )
            rows.append(("  the same with httpx: status", str(answer.status_code), "413"))
        except httpx.HTTPError as error:
            rows.append(("  the same with httpx: status", type(error).__name__, "413"))
        rows.append(("  server RSS MiB before / after", f"{rss_before:.0f} / {rss_mib(process.pid):.0f}", "flat"))

        body = chat_body(int(args.request_mib * (1 << 20)))
        with HealthProber(port, args.probe_interval_s, args.timeout_s) as prober:
            start = time.perf_counter()
            took, outcomes = asyncio.run(post_many(port, body, args.concurrency, timeout_s=3600))
            wall = time.perf_counter() - start
        latencies = [latency * 1000 for latency in prober.latencies]
        load = f"{args.concurrency} x {args.request_mib:g} MiB"
        rows.append((f"/health under {load}: probes (timeouts)", f"{len(latencies)} ({prober.num_timeouts})", ""))
        rows.append(
            (
                f"/health under {load}: ms p50 / p99 / max",
                f"{percentile(latencies, 0.5):.1f} / {percentile(latencies, 0.99):.1f} / {max(latencies):.1f}",
                "p99 < 100",
            )
        )
        rows.append((f"  the {load} requests: answers", repr(dict(outcomes)), ""))
        rows.append(
            (
                f"  the {load} requests: s p50 / max, wall",
                f"{statistics.median(took):.1f} / {max(took):.1f}, {wall:.1f}",
                "",
            )
        )

        log.mark()
        batch = 50
        for first in range(0, args.hang_ups, batch):
            threads = [threading.Thread(target=hang_up, args=(port,)) for _ in range(min(batch, args.hang_ups - first))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        time.sleep(2.0)  # the server logs each hang-up as it notices it
        text = log.since_mark()
        hang_up_lines = sum("hung up" in line for line in text.splitlines())
        rows.append(
            (
                f"{args.hang_ups} mid-body hang-ups: log lines / tracebacks",
                f"{len(text.splitlines())} ({hang_up_lines} 'hung up') / {text.count('Traceback')}",
                "1 each / 0",
            )
        )
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=args.timeout_s).status_code == 200

        log.mark()
        stop_body = chat_body(1 << 20)

        async def stop_under_load() -> tuple[float, collections.Counter[str]]:
            load_task = asyncio.create_task(post_many(port, stop_body, args.stop_requests, timeout_s=120))
            await asyncio.sleep(1.0)
            process.send_signal(signal.SIGTERM)
            start = time.perf_counter()
            while process.poll() is None:
                await asyncio.sleep(0.05)
            exited = time.perf_counter() - start
            _, outcomes = await load_task
            return exited, outcomes

        exited, stop_outcomes = asyncio.run(stop_under_load())
        text = log.since_mark()
        rows.append(
            (
                f"SIGTERM with {args.stop_requests} x 1 MiB running: s to exit, status",
                f"{exited:.1f}, {process.returncode}",
                "bounded, 0",
            )
        )
        rows.append(
            ("  their answers / tracebacks in the log", f"{dict(stop_outcomes)} / {text.count('Traceback')}", "- / 0")
        )
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    rows.append(
        ("tracebacks in the whole server log", str(log_path.read_text(errors="replace").count("Traceback")), "0")
    )
    width = max(len(row[0]) for row in rows)
    value_width = max(len(row[1]) for row in rows)
    print(f"\nserver: {args.src or 'src'} (log: {log_path})")
    print(f"{'measure':<{width}}  {'value':<{value_width}}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:<{value_width}}  {target}")


if __name__ == "__main__":
    main()
