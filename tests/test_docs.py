"""The docs stay true: the configuration table is the one generated from settings.py, and every
command the docs show still runs as written or at least parses — a ``python -m`` module or script
exists and takes every ``--flag`` the doc gives it (its ``--help``), a ``manage.py`` command exists and
its parser knows every flag, a ``make`` target exists, any other shell line splits."""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "bench" / "README.md",
               ROOT / "agent" / "README.md"])
#: Commands the doc shows as a console entry point, and the module behind each.
ENTRY_POINTS = {"outlier-agent": "agent", "outlier-shipper": "agent.shipper", "outlier-admin": None}
STARTS = ("python ", "python3 ", "manage.py ", "./manage.py ", "make ", *ENTRY_POINTS)
FLAG = re.compile(r"(?<![\w./-])--[a-z][a-z0-9-]*")


def commands(text: str) -> list[str]:
    """The shell commands of a Markdown text: the lines of its shell code blocks (fenced ``bash``,
    ``sh``, ``shell``, ``console`` or indented), and its inline code that starts as a command."""
    found: list[str] = []
    for lang, block in re.findall(r"(?ms)^```(\w*)\n(.*?)^```", text):
        if lang in ("bash", "sh", "shell", "console"):
            found += _lines(block)
    for block in re.findall(r"(?m)(?:^(?: {4}|\t)\S.*\n?)+", re.sub(r"(?ms)^```.*?^```", "", text)):
        found += [c for c in _lines(block) if c.startswith(STARTS) or (" " in c and "=" not in c.split()[0]
                  and c.split()[0] in ("helm", "docker", "celery", "pip", "make"))]
    for span in re.findall(r"`([^`\n]+)`", re.sub(r"(?ms)^```.*?^```", "", text)):
        words = span.split()
        span = " ".join(w for w in words if not re.fullmatch(r"[A-Z_]+=\S*", w)) if words else span
        if span.startswith(STARTS):
            found.append(span)
    return found


def _lines(block: str) -> list[str]:
    out, cur = [], ""
    for line in block.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line.strip().removeprefix("$ "))  # a trailing comment is no argument
        if not line or line.startswith("#"):
            continue
        cur = f"{cur} {line}" if cur else line
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip()
            continue
        out.append(cur)
        cur = ""
    return out + ([cur] if cur else [])


@functools.cache
def _help(argv: tuple[str, ...]) -> str:
    env = {**os.environ, "DJANGO_DEBUG": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, *argv, "--help"], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)
    assert proc.returncode == 0, f"{' '.join(argv)} --help: {proc.stderr[-500:]}"
    return proc.stdout


@functools.cache
def _manage_commands() -> dict[str, str]:
    import django
    from django.core.management import get_commands

    django.setup()
    return get_commands()


def _manage_flags(name: str) -> set[str]:
    from django.core.management import load_command_class

    parser = load_command_class(_manage_commands()[name], name).create_parser("manage.py", name)
    return {s for action in parser._actions for s in action.option_strings}


def check(command: str) -> str | None:
    """What is wrong with ``command``, or None."""
    try:
        words = shlex.split(command.split(" | ")[0].split(" && ")[0].split("; ")[0])
    except ValueError as exc:
        return f"does not split: {exc}"
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]  # VAR=value before the command
    if not words:
        return None
    flags = set(FLAG.findall(command))
    if words[0] in ("python", "python3") and len(words) > 1:
        words = words[1:]
    if words[0] in ("manage.py", "./manage.py"):
        if len(words) < 2 or words[1].startswith("-"):
            return None
        if words[1] not in _manage_commands():
            return f"no manage.py command {words[1]!r}"
        unknown = flags - _manage_flags(words[1])
        return f"manage.py {words[1]} has no {sorted(unknown)}" if unknown else None
    if words[0] == "-m" and len(words) > 1:
        argv: tuple[str, ...] = ("-m", words[1])
    elif words[0] in ENTRY_POINTS:
        if ENTRY_POINTS[words[0]] is None:
            return None
        argv = ("-m", ENTRY_POINTS[words[0]])
    elif words[0].endswith(".py"):
        if not (ROOT / words[0]).is_file():
            return f"no script {words[0]}"
        argv = (words[0],)
    elif words[0] == "make":
        targets = set(re.findall(r"(?m)^([a-z][\w-]*):", (ROOT / "Makefile").read_text()))
        missing = [w for w in words[1:] if "=" not in w and not w.startswith("-") and w not in targets]
        return f"no make target {missing}" if missing else None
    else:
        return None
    if argv[0] == "-m":
        import importlib.util

        if not re.fullmatch(r"[a-z_][\w.]*", argv[1]):
            return None  # a placeholder (`python -m ...`)
        try:
            spec = importlib.util.find_spec(argv[1])
        except ImportError:
            spec = None
        if spec is None:
            return f"no module {argv[1]}"
    if flags:
        rest = words[2:] if argv[0] == "-m" else words[1:]
        text = _help(argv)
        if rest and re.fullmatch(r"[a-z][a-z_-]*", rest[0]) and re.search(rf"{{[\w,-]*\b{rest[0]}\b", text):
            text = _help((*argv, rest[0]))  # a subcommand (`sim suite ...`): its own --help
        unknown = {f for f in flags if f not in text}
        return f"{' '.join(argv)} takes no {sorted(unknown)}" if unknown else None
    return None


def test_the_command_finder_reads_blocks_inline_code_and_continuations():
    text = ("Run `python -m sim run x.json --quick` or `DJANGO_DEBUG=1 python manage.py migrate`.\n\n"
            "```bash\n$ make demo\npython -m bench.pipeline \\\n    --out r.json\n```\n\n    helm install a b\n")
    assert commands(text) == ["make demo", "python -m bench.pipeline --out r.json", "helm install a b",
                              "python -m sim run x.json --quick", "python manage.py migrate"]
    assert check("python -m sim run x.json --no-such-flag") == "-m sim takes no ['--no-such-flag']"
    assert check("python manage.py no_such_command") == "no manage.py command 'no_such_command'"


def test_the_configuration_table_is_generated_from_settings():
    from scripts.settings_doc import main

    assert main(["--check"]) == 0, "python scripts/settings_doc.py --write"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_of_the_doc_still_parses(doc: Path):
    wrong = {c: why for c in commands(doc.read_text()) if (why := check(c))}
    assert wrong == {}, f"{doc.relative_to(ROOT)}: " + "\n".join(f"{c!r}: {w}" for c, w in wrong.items())
