"""RequestQueue: the submission side both Generator backends share, a queue of futures and the serving thread.

`HFGenerator` and `GraphGenerator` each own one: callers' submit / pause / resume / close land here, and the
serving thread calls the backend's `turn` (one batch, or one engine step) for as long as there is work.

    submit_many() --validate--> queue --serving thread, while unpaused and work remains--> turn() --> futures

pause() returns once the running turn is over; close() fails whatever is still queued and joins the thread.
"""

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from asyncppo.generation.protocol import GenerationRequest, GenerationResult, GeneratorClosedError

Submission = tuple[GenerationRequest, Future[GenerationResult]]


def _no_other_work() -> bool:
    return False


class RequestQueue:
    """Requests submitted but not yet taken by the backend, the pause / busy / closed flags, and the thread.

    `owner` names the backend in GeneratorClosedError messages; `validate` returns a request's problem (its
    future then fails with ValueError at once) or None. `has_other_work` keeps the thread turning with an empty
    queue (the graph engine's running rows); `on_death` hears the error that queued requests failed with when
    the serving loop itself dies. Call `start()` once the backend can take its first turn.
    """

    def __init__(
        self,
        owner: str,
        thread_name: str,
        validate: Callable[[GenerationRequest], str | None],
        turn: Callable[[], None],
        has_other_work: Callable[[], bool] = _no_other_work,
        on_death: Callable[[GeneratorClosedError], None] | None = None,
    ) -> None:
        self._owner, self._validate, self._turn = owner, validate, turn
        self._has_other_work, self._on_death = has_other_work, on_death
        self._state = threading.Condition()  # guards the fields below
        self._queue: deque[Submission] = deque()
        self._paused = False
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=thread_name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit_many(self, requests: Sequence[GenerationRequest]) -> "list[Future[GenerationResult]]":
        """Queue several requests in one step, in order, so the serving thread cannot take a turn between them."""
        futures: list[Future[GenerationResult]] = []
        accepted: list[Submission] = []
        for request in requests:
            futures.append(Future())
            if problem := self._validate(request):
                futures[-1].set_exception(ValueError(problem))
            else:
                accepted.append((request, futures[-1]))
        with self._state:
            if self._closed:
                for _, future in accepted:
                    future.set_exception(GeneratorClosedError(f"{self._owner} is closed; no new requests are served"))
                return futures
            self._queue.extend(accepted)
            self._state.notify_all()
        return futures

    def take(self, limit: int | None = None, *, start_running: bool = False) -> list[Submission]:
        """Pop up to `limit` queued requests (all by default), oldest first. With `start_running` each future is
        marked running, and one its caller cancelled while queued is dropped without counting toward the limit."""
        taken: list[Submission] = []
        with self._state:
            while self._queue and (limit is None or len(taken) < limit):
                request, future = self._queue.popleft()
                if not start_running or future.set_running_or_notify_cancel():
                    taken.append((request, future))
        return taken

    def pause(self) -> None:
        """Take no new turn and return once the running one (if any) is over; the queue is kept."""
        with self._state:
            self._paused = True
            self._state.wait_for(lambda: not self._busy)

    def resume(self) -> None:
        """Serve the queue again after pause()."""
        with self._state:
            self._paused = False
            self._state.notify_all()

    def close(self) -> None:
        """Fail queued requests with GeneratorClosedError, let a running turn finish, stop the thread."""
        self._fail_queued(f"{self._owner} was closed before this request ran")
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _fail_queued(self, message: str) -> None:
        """Close to new requests and fail every queued one (a future its caller cancelled is left as it is)."""
        with self._state:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._state.notify_all()
        for _, future in pending:
            if future.set_running_or_notify_cancel():
                future.set_exception(GeneratorClosedError(message))  # one each: a raise rewrites its traceback

    def _serve(self) -> None:
        try:
            self._serve_until_closed()
        except BaseException as error:
            # Only a bug in the loop itself gets here (a turn handles its own errors). Close the queue so that
            # no caller waits on a thread that is gone.
            message = f"the {self._owner} serving thread died: {error!r}"
            self._fail_queued(message)
            if self._on_death is not None:
                self._on_death(GeneratorClosedError(message))
            raise

    def _serve_until_closed(self) -> None:
        while True:
            with self._state:
                self._state.wait_for(
                    lambda: self._closed or (not self._paused and (bool(self._queue) or self._has_other_work()))
                )
                if self._closed:
                    return
                self._busy = True
            try:
                self._turn()
            finally:
                with self._state:
                    self._busy = False
                    self._state.notify_all()


class QueuedSubmission:
    """The Generator protocol's submission calls, answered by the backend's own RequestQueue (`_requests`).

    A base class on purpose: both backends answer these five calls identically through their queue, while what
    differs between them (a turn, weights, counters) stays in each backend.
    """

    _requests: RequestQueue

    def submit(self, request: GenerationRequest) -> "Future[GenerationResult]":
        """Queue one request; the future carries its result, a validation error or GeneratorClosedError."""
        return self.submit_many([request])[0]

    def submit_many(self, requests: Sequence[GenerationRequest]) -> "list[Future[GenerationResult]]":
        """Queue several requests in one step, in order (derived seeds follow it), so the serving thread cannot
        start a turn between them."""
        return self._requests.submit_many(requests)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Queue all requests together (they share batches) and wait; results are in request order."""
        return [future.result() for future in self.submit_many(requests)]

    def pause(self) -> None:
        """Start no new turn and return once the running one is over; queued requests (and the graph engine's
        running rows, in their slots) stay."""
        self._requests.pause()

    def resume(self) -> None:
        """Serve the queue again after pause()."""
        self._requests.resume()
