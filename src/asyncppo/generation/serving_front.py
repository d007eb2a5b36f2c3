"""ServingFront: the one request front of every generation backend, and EngineCore, the narrow part a backend writes.

`HFGenerator`, `GraphGenerator` and `ReplayGenerator` are each a ServingFront over their own core; the workers, the
policy server and the rollouts see only the `Generator` protocol (`protocol.py`) that the front implements.

    submit_many --core.request_problem--> queue --serving thread, one turn at a time, under the core lock:
        core.admit(up to core.admission_limit() of the oldest queued) --> core.step() if core.has_work() --> futures

    caller call                   what the front does                      core calls (under the core lock)
    submit / submit_many          validate, queue; fail at once if closed  request_problem (without the lock)
    pause / resume                start no turn / turn again               -
    load_weights / set_version*   between turns; then policy_version       weights_changed
    reseed                        admit what is queued, then reseed        admission_limit, admit, reseed
    close                         fail the queue, join the thread          fail_all (closed while it ran)
    (a turn raises)               fail the turn's requests, serve on       fail_all (the error)
    * set_policy_version

Everything that is not decoding lives here, once: validation errors, the queue, cancellation of queued requests,
pause, close, a failing turn, a dying thread, the policy version and the lock that keeps weight changes between
turns. A core resolves the futures it admitted; a future its caller may have cancelled is failed only through
`fail_unless_done`.
"""

import contextlib
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Protocol

import torch

from asyncppo.generation.protocol import GenerationRequest, GenerationResult, GeneratorClosedError

Submission = tuple[GenerationRequest, Future[GenerationResult]]


def fail_unless_done(future: Future[GenerationResult], error: BaseException) -> None:
    """Fail `future` with `error` unless it is already done (its caller cancelled it, or it has its result)."""
    # Checking done() first would race with a caller's cancel, so the setter decides.
    with contextlib.suppress(InvalidStateError):
        future.set_exception(error)


class EngineCore(Protocol):
    """What a backend implements behind a ServingFront. Every method but `request_problem` is called with the
    front's core lock held, so one at a time and never during another's turn."""

    def request_problem(self, request: GenerationRequest) -> str | None:
        """Why `request` can never run here (its future then fails with ValueError at once), or None. Called on the
        submitting thread without the lock: it may read only what is fixed at construction."""
        ...

    def admission_limit(self) -> int | None:
        """How many queued requests the next turn admits; None admits all (the core queues them itself)."""
        ...

    def admit(self, submissions: Sequence[Submission]) -> None:
        """Take these requests over, oldest first. Their futures are still pending: the core starts each with
        `set_running_or_notify_cancel` (dropping one cancelled meanwhile) when it starts it, and resolves it."""
        ...

    def has_work(self) -> bool:
        """Admitted requests are unfinished (the serving thread turns again while they are)."""
        ...

    def step(self) -> None:
        """Advance the admitted requests: one batch, or one engine step. If it raises, the front fails every
        request the core holds with the error (`fail_all`) and serves on."""
        ...

    def fail_all(self, error: BaseException) -> None:
        """Fail every request the core holds with `error` and let them go (through fail_unless_done where a
        future may still be pending, so cancellable)."""
        ...

    def weights_changed(self, version: int, named_tensors: Sequence[tuple[str, torch.Tensor]] | None) -> None:
        """New weights between turns: copy `named_tensors` in (checked completely first, so a rejected update
        changes nothing), or with None take the model's current values (a colocated trainer changed them in
        place). Tokens sampled from now on carry `version`."""
        ...

    def reseed(self, seed: int) -> None:
        """Restart the sampling randomness at `seed` for the requests admitted from now on."""
        ...

    def counters(self) -> dict[str, float]:
        """The core's cumulative counters by name (summable over ranks); {} when it keeps none."""
        ...


class ServingFront:
    """A Generator: submissions, pausing, closing and weight versions over one EngineCore and its serving thread.

    `name` names the engine in GeneratorClosedError messages and its thread. A backend's class is a ServingFront
    built over its core (a subclass only for its constructor and typed `stats()`): no protocol call is overridden.
    """

    def __init__(self, name: str, core: EngineCore, policy_version: int = 0) -> None:
        self._name, self._core = name, core
        self._policy_version = policy_version
        self._core_lock = threading.Lock()  # held for a turn, and by weight, version and seed changes
        self._state = threading.Condition()  # guards the fields below; taken inside the core lock, never around it
        self._queue: deque[Submission] = deque()
        self._paused = False
        self._busy = False
        self._closed = False
        self._core_has_work = False  # core.has_work() as of the last call that changed it (read by the wait)
        self._thread = threading.Thread(target=self._serve, name=f"{name}-serving", daemon=True)
        self._thread.start()

    @property
    def policy_version(self) -> int:
        """Version of the weights currently loaded."""
        return self._policy_version

    def submit(self, request: GenerationRequest) -> "Future[GenerationResult]":
        """Queue one request; the future carries its result, a validation error or GeneratorClosedError."""
        return self.submit_many([request])[0]

    def submit_many(self, requests: Sequence[GenerationRequest]) -> "list[Future[GenerationResult]]":
        """Queue several requests in one step, in order (derived seeds follow it), so the serving thread cannot
        start a turn between them."""
        futures: list[Future[GenerationResult]] = []
        accepted: list[Submission] = []
        for request in requests:
            futures.append(Future())
            if problem := self._core.request_problem(request):
                futures[-1].set_exception(ValueError(problem))
            else:
                accepted.append((request, futures[-1]))
        with self._state:
            if not self._closed:
                self._queue.extend(accepted)
                self._state.notify_all()
                return futures
        for _, future in accepted:
            future.set_exception(GeneratorClosedError(f"{self._name} is closed; no new requests are served"))
        return futures

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Queue all requests together (they share batches) and wait; results are in request order."""
        return [future.result() for future in self.submit_many(requests)]

    def pause(self) -> None:
        """Start no new turn and return once the running one is over; queued and admitted requests stay."""
        with self._state:
            self._paused = True
            self._state.wait_for(lambda: not self._busy)

    def resume(self) -> None:
        """Serve again after pause()."""
        with self._state:
            self._paused = False
            self._state.notify_all()

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy a full set of parameters in by name and set the version, between turns (waits for a running one).
        A rejected update (missing, extra or misshapen parameters) leaves the old weights and version."""
        received = list(named_tensors)
        with self._core_lock:
            self._core.weights_changed(version, received)
            self._policy_version = version

    def set_policy_version(self, version: int) -> None:
        """Set the version without sending weights (a colocated trainer updated the shared model in place)."""
        with self._core_lock:
            self._core.weights_changed(version, None)
            self._policy_version = version

    def reseed(self, seed: int) -> None:
        """Restart the sampling randomness at `seed`, e.g. once per training step. What is queued is admitted
        first, so an engine that gives each request a seed at admission keeps the old sequence's for them."""
        with self._core_lock:
            self._core.admit(self._take(self._core.admission_limit()))
            self._core.reseed(seed)
            self._note_core_work()

    def counters(self) -> dict[str, float]:
        """The engine's cumulative counters by name; {} for an engine that keeps none."""
        with self._core_lock:
            return self._core.counters()

    def close(self) -> None:
        """Fail queued requests with GeneratorClosedError, let a running turn finish, fail what the engine still
        holds, stop the thread. Idempotent; callable from any thread."""
        self._close_queue(f"{self._name} was closed before this request ran")
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _take(self, limit: int | None) -> list[Submission]:
        """Pop up to `limit` queued requests (all for None), oldest first; one cancelled while queued is dropped
        without counting toward the limit."""
        taken: list[Submission] = []
        with self._state:
            while self._queue and (limit is None or len(taken) < limit):
                request, future = self._queue.popleft()
                if not future.cancelled():
                    taken.append((request, future))
        return taken

    def _note_core_work(self) -> None:
        """Publish core.has_work() to the serving thread's wait (caller holds the core lock)."""
        has_work = self._core.has_work()
        with self._state:
            self._core_has_work = has_work
            self._state.notify_all()

    def _close_queue(self, message: str) -> None:
        """Take no new requests and fail every queued one with GeneratorClosedError(message)."""
        with self._state:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._state.notify_all()
        for _, future in pending:
            fail_unless_done(future, GeneratorClosedError(message))  # one each: a raise rewrites its traceback

    def _serve(self) -> None:
        try:
            self._serve_until_closed()
        except BaseException as error:
            # A turn fails its own requests and serves on after an Exception; only SystemExit and the like, or a
            # bug in the loop, get here. Close everything so that no caller waits on a thread that is gone.
            message = f"the {self._name} serving thread died: {error!r}"
            self._close_queue(message)
            with self._core_lock:
                self._core.fail_all(GeneratorClosedError(message))
            raise

    def _serve_until_closed(self) -> None:
        while True:
            with self._state:
                self._state.wait_for(
                    lambda: self._closed or (not self._paused and (bool(self._queue) or self._core_has_work))
                )
                if self._closed:
                    break
                self._busy = True
            try:
                self._turn()
            finally:
                with self._state:
                    self._busy = False
                    self._state.notify_all()
        with self._core_lock:
            self._core.fail_all(GeneratorClosedError(f"{self._name} was closed while this request ran"))

    def _turn(self) -> None:
        """Admit what the core takes now, then one step; a raising turn fails the requests it touched."""
        with self._core_lock:
            taken = self._take(self._core.admission_limit())
            try:
                self._core.admit(taken)
                if self._core.has_work():
                    self._core.step()
            except BaseException as error:  # fault isolation is the point: the turn's requests fail, serving goes on
                self._core.fail_all(error)
                for _, future in taken:
                    fail_unless_done(future, error)  # admit may have raised before the core held them all
                if not isinstance(error, Exception):
                    raise  # SystemExit and the like end the serving thread (see _serve)
            finally:
                self._note_core_work()
