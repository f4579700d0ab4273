"""``outlier-admin``: Django's ``manage.py`` for an installed wheel (``outlier-admin migrate``,
``outlier-admin create_token ...``), where the repository's ``manage.py`` is not shipped."""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Run a management command with the project's settings (``DJANGO_SETTINGS_MODULE`` may override)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "outlier_admin.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
