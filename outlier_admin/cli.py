"""``outlier-admin``: Django's ``manage.py`` for an installed wheel (``outlier-admin migrate``,
``outlier-admin create_token ...``), where the repository's ``manage.py`` is not shipped; the
repository's ``manage.py`` runs this too.

A command run without its environment says in one line what to set, instead of a traceback: the
settings refuse to start in production mode without ``SECRET_KEY``/``ALLOWED_HOSTS``
(``ImproperlyConfigured``), and a database nobody migrated has no tables (``no such table`` on the
zero-setup SQLite, ``relation ... does not exist`` on PostgreSQL). ``--traceback`` keeps Django's
traceback."""

from __future__ import annotations

import os
import sys

#: What to set, said once for both mistakes.
ENVIRONMENT = ("set DJANGO_DEBUG=1 for a local run (SQLite, no secrets), or SECRET_KEY, ALLOWED_HOSTS and "
               "DATABASE_URL (postgres://...) for a deployment")


def _database() -> str:
    """The database the settings use, without its password."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        return f"SQLite {db['NAME']}"
    return f"{db['ENGINE'].rsplit('.', 1)[-1]} {db.get('USER') or ''}@{db.get('HOST') or 'localhost'}:" \
           f"{db.get('PORT') or ''}/{db['NAME']}"


def explain(exc: BaseException) -> str | None:
    """One line saying what to set or run for an error a command hit for want of its environment
    (None: not such an error)."""
    from django.core.exceptions import ImproperlyConfigured
    from django.db.utils import OperationalError, ProgrammingError

    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, ImproperlyConfigured):
        return f"{text}: {ENVIRONMENT}"
    if isinstance(exc, OperationalError | ProgrammingError):
        if "no such table" in text or ("relation" in text and "does not exist" in text):
            return (f"the database ({_database()}) has no tables ({text}): run `migrate` first, or point "
                    "DATABASE_URL at the migrated database")
        if "connect" in text or "could not translate host" in text:
            return f"cannot reach the database ({_database()}): {text}; {ENVIRONMENT}"
    return None


def main(argv: list[str] | None = None) -> None:
    """Run a management command with the project's settings (``DJANGO_SETTINGS_MODULE`` may override)."""
    argv = list(sys.argv if argv is None else argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outlier_admin.settings")
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(argv)
    except Exception as exc:
        line = None if "--traceback" in argv else explain(exc)
        if line is None:
            raise
        sys.stderr.write(f"{os.path.basename(argv[0]) if argv else 'outlier-admin'}: {line}\n")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
