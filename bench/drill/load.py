"""Open-loop Poisson load through the gateway, every request recorded.

Why open loop: users do not wait for each other. A closed loop (N clients, each sending when its last
answer came) slows down with the fleet, so a slow node throttles the load that would have queued
behind it and the tail the user sees never appears. Here arrivals are a Poisson process of ``rate``
per second (exponential gaps, seeded): fixed in advance, whatever the fleet does. Each request runs
on its own thread (bounded by ``max_in_flight``; an arrival with no thread free is recorded as
``dropped``, never delayed) with its own connection, so the gateway balances each one.

Requests are llama.cpp's OpenAI-style ``POST /v1/completions`` with a prompt of 8-120 random words
and ``max_tokens`` 16-40 (what the user sent): varied sizes, and random words so the engines'
prompt caches do not make one node look fast. A request not answered within ``timeout_s`` (60 s) is a
timeout: it counts in the latency figures at ``timeout_s`` and separately as a timeout.

Bounded in count (``rate * duration_s``, at most :data:`MAX_REQUESTS`) and time (``duration_s`` plus
one ``timeout_s``); :meth:`PoissonLoad.run` returns when the last request has ended.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

#: What the user sent: prompts of 8-120 words, 16-40 tokens out.
PROMPT_WORDS = (8, 120)
MAX_TOKENS = (16, 40)
#: The model name every request names: llama.cpp serves its one model whatever the name; the routers
#: that require the field (smg, the vLLM router) or route by it (LiteLLM's ``model_name``) get this one.
MODEL = "gemma-3-270m"
#: The client's patience; a request still unanswered then is a timeout.
TIMEOUT_S = 60.0
#: Hard bounds: no drill sends more than this, or for longer than an hour.
MAX_REQUESTS = 20_000
MAX_DURATION_S = 3600.0
MAX_RATE = 100.0
#: Words to draw prompts from (ordinary English: the tokenizer sees ordinary tokens).
_WORDS = (
    "the of and to in is was he for it with as his on be at by had are but from or have an they which one you "
    "were all we her she there would their will when who him been has more if no out do so can what up said "
    "about other into than its time only could new them man some these then two first may any like now my "
    "such make over our even most me state after also made many did must before back see through way where "
    "get much go well your know should down work year because come people just say each those take day good "
    "how long little own very world still life great under last might house here every never old again place "
    "thought while another hand same small large found right three home both near light water story river city"
)
WORDS = _WORDS.split()


@dataclass
class Request:
    """One request as the client saw it (times are wall-clock seconds; ``latency_s`` is ``None`` for
    a request that never got an answer nor a timeout, e.g. ``dropped``)."""

    i: int
    sent_at: float
    prompt_words: int
    max_tokens: int
    latency_s: float | None = None
    status: int = 0          # HTTP status; 0 when there was none (timeout, connection error, dropped)
    outcome: str = "pending"  # ok | http_error | timeout | error | dropped
    served_by: str | None = None
    completion_tokens: int | None = None
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def arrivals(rate: float, duration_s: float, seed: int) -> list[float]:
    """Offsets (s) of a Poisson process of ``rate``/s over ``[0, duration_s)``, at most MAX_REQUESTS."""
    if not 0 < rate <= MAX_RATE:
        raise ValueError(f"rate is 0 to {MAX_RATE} requests/s, got {rate!r}")
    if not 0 < duration_s <= MAX_DURATION_S:
        raise ValueError(f"duration is 0 to {MAX_DURATION_S} s, got {duration_s!r}")
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate)
    while t < duration_s and len(out) < MAX_REQUESTS:
        out.append(t)
        t += rng.expovariate(rate)
    return out


class PoissonLoad:
    """Poisson arrivals at ``url`` (see module docstring). ``served_by`` maps the gateway's
    ``X-Upstream`` header to an engine address (:meth:`bench.drill.gateways.Gateway.served_by`)."""

    def __init__(self, url: str, *, rate: float, duration_s: float, seed: int = 1, timeout_s: float = TIMEOUT_S,
                 served_by: Callable[[str | None], str | None] = lambda h: h, header: str = "X-Upstream",
                 max_in_flight: int = 512, headers: dict[str, str] | None = None) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        if host != "127.0.0.1" and host != "localhost":
            raise ValueError(f"the drill sends only to loopback, got {url!r}")
        self.host, self.port = host, int(port)
        self.timeout_s = float(timeout_s)
        if not 1.0 <= self.timeout_s <= 600.0:
            raise ValueError(f"timeout is 1 to 600 s, got {timeout_s!r}")
        self.offsets = arrivals(rate, duration_s, seed)
        self.rate, self.duration_s = rate, duration_s
        self.served_by_of = served_by
        self.header = header
        self.headers = dict(headers or {})
        self._rng = random.Random(seed + 1)
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._stop = threading.Event()
        self.requests: list[Request] = []
        self.started_at: float | None = None
        self._threads: list[threading.Thread] = []

    def _body(self, words: int, max_tokens: int) -> bytes:
        prompt = " ".join(self._rng.choice(WORDS) for _ in range(words))
        return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8,
                           "stream": False}).encode()

    def _send(self, req: Request, body: bytes) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        t0 = time.monotonic()
        try:
            conn.request("POST", "/v1/completions", body=body,
                         headers={"Content-Type": "application/json", "Connection": "close", **self.headers})
            resp = conn.getresponse()
            data = resp.read()
            req.latency_s = time.monotonic() - t0
            req.status = resp.status
            req.served_by = self.served_by_of(resp.getheader(self.header))
            if resp.status == 200:
                req.outcome = "ok"
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    req.completion_tokens = int(json.loads(data)["usage"]["completion_tokens"])
            else:
                req.outcome = "http_error"
        except TimeoutError:
            req.latency_s, req.outcome = self.timeout_s, "timeout"
        except OSError as exc:
            req.latency_s, req.outcome, req.error = time.monotonic() - t0, "error", str(exc)[:200]
        except http.client.HTTPException as exc:
            req.latency_s, req.outcome, req.error = time.monotonic() - t0, "error", repr(exc)[:200]
        finally:
            conn.close()
            self._slots.release()

    def run(self, on_tick: Callable[[float], None] | None = None) -> list[Request]:
        """Send every arrival on time, then wait for the answers; ``on_tick(elapsed_s)`` is called
        about every 100 ms from this thread (the drill starts its fault from there). Returns the
        requests in arrival order."""
        start = time.time()
        mono0 = time.monotonic()
        self.started_at = start
        lo_w, hi_w = PROMPT_WORDS
        lo_t, hi_t = MAX_TOKENS
        pending = list(enumerate(self.offsets))
        pending.reverse()
        while pending and not self._stop.is_set():
            elapsed = time.monotonic() - mono0
            if on_tick is not None:
                on_tick(elapsed)
            while pending and pending[-1][1] <= elapsed:
                i, offset = pending.pop()
                req = Request(i, start + offset, self._rng.randint(lo_w, hi_w), self._rng.randint(lo_t, hi_t))
                self.requests.append(req)
                if not self._slots.acquire(blocking=False):
                    req.outcome = "dropped"
                    continue
                t = threading.Thread(target=self._send, args=(req, self._body(req.prompt_words, req.max_tokens)),
                                     name=f"load-{i}", daemon=True)
                t.start()
                self._threads.append(t)
            nxt = pending[-1][1] - (time.monotonic() - mono0) if pending else 0.0
            time.sleep(max(0.0, min(0.1, nxt)))
        while time.monotonic() - mono0 < self.duration_s and not self._stop.is_set():  # the tail of the window
            if on_tick is not None:
                on_tick(time.monotonic() - mono0)
            time.sleep(0.1)
        deadline = time.monotonic() + self.timeout_s + 5
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        return self.requests

    def stop(self) -> None:
        """Send nothing more (requests in flight still end by their timeout)."""
        self._stop.set()
