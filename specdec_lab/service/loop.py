"""The engine thread: the one thread that touches the Server.

    engine = EngineLoop(server, max_waiting=64)
    engine.start()
    handle = engine.submit(ids, on_tokens, on_done, max_new_tokens=32).result()   # a concurrent Future
    engine.cancel(handle)                                                          # returns at once
    engine.stop()                                                                  # cancels what is left

The Server is not thread-safe, so every call into it (submit, cancel, step) runs on this thread. Other
threads hand it jobs through an inbox and wake it; it runs the inbox's jobs between steps, steps while
any request waits or runs, and sleeps on a condition when idle. Jobs rather than a lock the callers take:
Python's locks are not fair, and a loop that takes the lock back after every step of tens of
milliseconds would keep a submitter waiting for many steps.

`on_tokens(new_ids)` runs on this thread, inside the step (the Server's on_step hook), and
`on_done(handle)` once after the request ended (finished, cancelled or failed); both must be quick and
must not call the server (an asyncio reply uses loop.call_soon_threadsafe). A StepError (a failed step,
which changed nothing) is logged and the loop steps again; the Server isolates a step that keeps failing.
"""
import logging
import threading
from concurrent.futures import Future

from ..serve import StepError

log = logging.getLogger("specdec_lab.service")


class Busy(Exception):
    """More requests wait than --max-waiting allows (answered 429)."""


class Closed(Exception):
    """The engine is shutting down and admits nothing (answered 503)."""


class EngineLoop:
    def __init__(self, server, max_waiting=64, metrics=None):
        if isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 0:
            raise ValueError(f"max_waiting must be an int >= 0, got {max_waiting!r}")
        self.server, self.max_waiting, self.metrics = server, max_waiting, metrics
        self._cond = threading.Condition()
        self._inbox: list = []  # (function, Future) jobs for this thread
        self._watched: dict = {}  # handle -> on_done, for every request not yet reported done
        self._reasons: dict = {}  # handle -> why it was cancelled, until reported
        self._open, self._stopping, self._ended = True, False, False
        self.step_errors = 0
        self._thread = threading.Thread(target=self._run, name="specdec-engine", daemon=True)

    def start(self):
        self._thread.start()
        return self

    # -- from any thread -------------------------------------------------------------

    def submit(self, ids, on_tokens, on_done, **sampling) -> Future:
        """A Future of the Handle; its exception is ValueError (bad input, from Server.submit), Busy or Closed."""
        return self._post(lambda: self._submit(ids, on_tokens, on_done, sampling))

    def submit_all(self, requests) -> Future:
        """submit for several requests, (ids, on_tokens, on_done, sampling) each, in one job, so that they
        queue together (the n answers to one request: admitted in one step, their prompt is read once).
        A Future of the Handles; when one is refused, the ones queued before it are cancelled."""
        return self._post(lambda: self._submit_all(requests))

    def cancel(self, handle, reason="abort") -> Future:
        """Cancel a request (its blocks return at once, between steps); does not wait. `reason`: what the
        metrics count it as ("stop" when the answer met a stop string, else "abort")."""
        return self._post(lambda: self._cancel(handle, reason))

    def close(self):
        """Admit nothing more (submit's Future raises Closed); what waits and runs goes on."""
        self._open = False

    def stop(self, timeout=30.0):
        """Admit nothing more, cancel what waits and runs, and end the thread."""
        with self._cond:
            self._open, self._stopping = False, True
            self._cond.notify()
        self._thread.join(timeout)

    @property
    def accepting(self) -> bool:
        return self._open

    def _post(self, fn) -> Future:
        fut = Future()
        with self._cond:
            if self._ended:
                fut.set_exception(Closed("the server is shutting down"))
                return fut
            self._inbox.append((fn, fut))
            self._cond.notify()
        return fut

    # -- on the engine thread --------------------------------------------------------

    def _run(self):
        while True:
            with self._cond:
                while not self._inbox and self.server.idle and not self._stopping:
                    self._cond.wait()
                jobs, self._inbox = self._inbox, []
                stopping = self._stopping
            for fn, fut in jobs:
                _run_job(fn, fut)
            if stopping:
                return self._shut()
            self._step()
            self._report_done()

    def _step(self):
        if self.server.idle:
            return
        try:
            self.server.step()
        except StepError as err:  # nothing changed; the next step runs it again
            self.step_errors += 1
            log.warning("%s", err)
        except Exception:  # a defect, not a fault the Server handles: keep serving the others, and say so
            self.step_errors += 1
            log.exception("Server.step raised")

    def _submit(self, ids, on_tokens, on_done, sampling):
        if not self._open:
            raise Closed("the server is shutting down")
        if len(self.server.waiting) >= self.max_waiting:
            raise Busy(f"{len(self.server.waiting)} requests are waiting, the most this server queues "
                       f"(--max-waiting {self.max_waiting}); retry later")
        handle = self.server.submit(ids, on_step=self._hook(on_tokens), **sampling)
        self._watched[handle] = on_done
        return handle

    def _submit_all(self, requests):
        handles = []
        try:
            for ids, on_tokens, on_done, sampling in requests:
                handles.append(self._submit(ids, on_tokens, on_done, sampling))
        except BaseException:
            for handle in handles:
                self._cancel(handle, "abort")
            raise
        return handles

    def _hook(self, on_tokens):
        metrics = self.metrics

        def on_step(handle, new):
            if metrics is not None:
                metrics.on_tokens(handle)
            on_tokens(new)
        return on_step

    def _cancel(self, handle, reason):
        if not handle.done:
            self._reasons[handle] = reason
        handle.cancel()
        self._report_done()

    def _report_done(self):
        for handle in [h for h in self._watched if h.done]:
            on_done = self._watched.pop(handle)
            reason = self._reasons.pop(handle, None)
            if self.metrics is not None:
                self.metrics.on_done(handle, reason)
            try:
                on_done(handle)
            except Exception:  # a reply that cannot be delivered is its own; the loop goes on
                log.exception("on_done of request %s raised", handle.id)

    def _shut(self):
        for handle in list(self._watched):
            handle.cancel()
        self._report_done()
        with self._cond:  # jobs that came in since: refused
            jobs, self._inbox, self._ended = self._inbox, [], True
        for _, fut in jobs:
            fut.set_exception(Closed("the server is shutting down"))


def _run_job(fn, fut):
    if not fut.set_running_or_notify_cancel():
        return
    try:
        fut.set_result(fn())
    except BaseException as err:  # the caller's error (a ValueError from submit, Busy, Closed)
        fut.set_exception(err)
