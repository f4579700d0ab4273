"""nginx (open source) integration: render an upstream include, validate, swap atomically, reload.

The way consul-template style tools do it:

1. ``render_upstream`` (pure) turns the effective weights into::

       # Managed by outlier-admin agent (group llama-70b). Do not edit: overwritten on every change.
       upstream outlier_llama-70b {
           server 10.0.0.7:8000 weight=100;
           server 10.0.0.8:8000 weight=35;
           server 10.0.0.9:8000 down;        # quarantined node: weight 0 or a quarantine state
       }

   nginx weights must be >= 1, so our ``0..base`` weight is used as is and 0 becomes ``down``. The
   text contains no version or timestamp: identical weights render identical bytes, so **nothing is
   written and nginx is not reloaded when nothing changed**.
2. The new text is written to a temporary file in the include's directory, fsynced and renamed over
   the include (atomic on POSIX: nginx never reads half a file).
3. ``nginx -t`` (the configured test command) validates the whole configuration. On failure the
   previous include is put back the same way and the error is raised: the running nginx never saw
   the bad file.
4. ``nginx -s reload`` (the configured reload command): the master re-reads the configuration, new
   workers use the new weights, old workers finish their requests. When no nginx runs (the reload
   says so: :func:`nginx_not_running`), the validated file is the one nginx reads when it starts, so
   this is not a failure: the result's ``note`` says it (the agent logs it). That is how the include
   is created before nginx first starts (``--once``). Any other reload failure is an error.

The include goes in the ``http {}`` context; the server blocks ``proxy_pass http://<upstream>;``.
Directives of the block other than the servers (``least_conn``, ``keepalive 32``) are the applier's
``directives`` (the CLI's repeatable ``--nginx-directive``): the agent owns the whole file, so what
nginx should balance with must be rendered by it too, or the first apply would drop it.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from agent.base import ApplyError, ApplyResult
from agent.client import EffectiveWeights

HEADER = "# Managed by outlier-admin agent (group {group}). Do not edit: overwritten on every change.\n"


#: What a reload prints when there is no nginx to reload. nginx's own ``-s reload``
#: (``ngx_signal_process``): no PID file (an ``[error]``-level open failure: a missing configuration
#: file is ``[emerg]``), an empty one (``invalid PID number ""``, Debian's state before the first
#: start), or a PID no process has (``kill(N, 1) failed (3: No such process)``, after a crash);
#: systemd's ``systemctl reload nginx`` of a stopped unit. Permission or configuration errors match none.
_NOT_RUNNING = re.compile(
    r'\[error\] open\(\) "[^"]*" failed \(2: No such file or directory\)'
    r"|invalid PID number"
    r"|kill\(\d+, \d+\) failed \(3: No such process\)"
    r"|is not active, cannot reload"
)


def nginx_not_running(reload_output: str) -> bool:
    """Whether a failed reload's output says no nginx runs (see :data:`_NOT_RUNNING`), as opposed to
    a running nginx that could not be reloaded."""
    return bool(_NOT_RUNNING.search(reload_output))


def upstream_name_for(group: str) -> str:
    """Default upstream name: ``outlier_<group>`` with characters nginx dislikes replaced."""
    return "outlier_" + "".join(c if c.isalnum() or c in "-_." else "_" for c in group)


#: An upstream-block directive as the agent accepts it: a name and plain arguments, one statement.
#: No ``{ } ; #`` quotes or line breaks inside, so a value from a command line or an environment
#: variable cannot close the block or add a ``server`` the weights do not know.
_DIRECTIVE = re.compile(r"[a-z_][a-z0-9_]*(?: [A-Za-z0-9_.:=/$-]+)*")
DIRECTIVE_MAX = 200


def check_directive(directive: str) -> str:
    """``directive`` normalised (spaces collapsed, a trailing ``;`` dropped), or ``ValueError``.

    What users put there (``least_conn``, ``keepalive 32``, ``hash $request_id consistent``, ``zone
    llm 64k``, ``random two least_conn``) passes. ``server`` is refused: the servers are the
    weights' (every node of the document, rendered by :func:`render_upstream`)."""
    if not isinstance(directive, str):
        raise ValueError(f"a directive is text, got {type(directive).__name__}")
    text = " ".join(directive.strip().removesuffix(";").split())
    broken = any(c in directive for c in "\r\n\v\f\0")  # one line, whatever the spaces around it
    if broken or not text or len(text) > DIRECTIVE_MAX or not _DIRECTIVE.fullmatch(text):
        raise ValueError(f"not an upstream directive (a name and plain arguments, at most {DIRECTIVE_MAX} "
                         f"characters, no braces, ';', '#', quotes or line breaks): {directive[:DIRECTIVE_MAX]!r}")
    if text.split()[0] == "server":
        raise ValueError("'server' lines are rendered from the weights document; not a directive to add")
    return text


def render_upstream(weights: EffectiveWeights, upstream: str, server_params: str = "",
                    directives: Sequence[str] = ()) -> str:
    """The include file text for ``weights`` (deterministic; see module docstring). ``directives``
    (each checked by :func:`check_directive`) come first in the block, in the order given:
    ``least_conn`` and the other balancing methods must precede ``keepalive``, which nginx wants
    after the method."""
    lines = [HEADER.format(group=weights.group), f"upstream {upstream} {{\n"]
    for directive in directives:  # e.g. "least_conn", "keepalive 32"
        lines.append(f"    {check_directive(directive)};\n")
    extra = f" {server_params.strip()}" if server_params.strip() else ""
    for node in sorted(weights.nodes, key=lambda n: n.address):
        if node.quarantined:
            # Not the exact state: quarantined <-> probing flips at every canary and must not
            # rewrite the file and reload nginx when routing does not change.
            lines.append(f"    server {node.address}{extra} down;  # {node.node} quarantined\n")
        else:
            lines.append(f"    server {node.address} weight={max(1, node.weight)}{extra};  # {node.node}\n")
    lines.append("}\n")
    return "".join(lines)


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temp file next to ``path``, fsync it and rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _server_lines(text: str | None) -> set[str]:
    if not text:
        return set()
    return {ln.split("#")[0].strip() for ln in text.splitlines() if ln.strip().startswith("server ")}


class NginxApplier:
    """Applies effective weights to one nginx upstream include file."""

    name = "nginx"

    def __init__(
        self,
        include_path: str | os.PathLike[str],
        upstream: str,
        *,
        test_cmd: Sequence[str] = ("nginx", "-t", "-q"),
        reload_cmd: Sequence[str] = ("nginx", "-s", "reload"),
        server_params: str = "",
        directives: Sequence[str] = (),
        timeout_s: float = 20.0,
    ) -> None:
        self.include_path = Path(include_path)
        self.upstream = upstream
        self.test_cmd = list(test_cmd)
        self.reload_cmd = list(reload_cmd)
        self.server_params = server_params
        self.directives = [check_directive(d) for d in directives]  # refused here, before any write
        self.timeout_s = timeout_s

    def render(self, weights: EffectiveWeights) -> str:
        return render_upstream(weights, self.upstream, self.server_params, self.directives)

    def apply(self, weights: EffectiveWeights) -> ApplyResult:
        new = self.render(weights)
        try:
            old: str | None = self.include_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            old = None
        if new == old:
            return ApplyResult()
        write_atomically(self.include_path, new)
        ok, output = self._run(self.test_cmd)
        if not ok:
            if old is None:
                self.include_path.unlink(missing_ok=True)
            else:
                write_atomically(self.include_path, old)
            raise ApplyError(f"nginx -t rejected the rendered upstream (previous file restored): {output}")
        ok, output = self._run(self.reload_cmd)
        note = ""
        if not ok:
            if not nginx_not_running(output):
                raise ApplyError(f"nginx reload failed (valid file in place, old config running): {output}")
            note = (f"nginx is not running ({output}): {self.include_path} written and validated, not reloaded; "
                    "nginx reads it when it starts")
        before, after = _server_lines(old), _server_lines(new)
        changes = [f"- {ln}" for ln in sorted(before - after)] + [f"+ {ln}" for ln in sorted(after - before)]
        return ApplyResult(changes=changes or [f"rewrote {self.include_path}"], note=note)

    def set_safeguard(self, active: bool) -> None:
        # Open-source nginx has no runtime variables; the flag is in the agent's logs and metrics.
        return None

    def _run(self, argv: list[str]) -> tuple[bool, str]:
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"{argv[0]}: {exc}"
        return proc.returncode == 0, (proc.stderr or proc.stdout).strip()[-2000:]
