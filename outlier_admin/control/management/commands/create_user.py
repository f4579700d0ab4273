"""``manage.py create_user NAME --role viewer|operator|oncall [--role ...] [--password-stdin]``.

Without ``--password-stdin`` a random password is generated and printed alone on the last line,
once (scripts: ``PW=$(manage.py create_user alice --role oncall | tail -1)``). Audited
(``user.create``) like every other change.
"""

from __future__ import annotations

import secrets
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from outlier_admin.control.actions import ActionError, do_create_user
from outlier_admin.fleet.roles import ROLES


class Command(BaseCommand):
    help = "Create a user with one or more roles; a generated password is printed alone on the last line."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", action="append", required=True, choices=ROLES,
                            help="viewer (read), operator (thresholds, policy, approvals), oncall (overrides); repeat "
                                 "for several")
        parser.add_argument("--password-stdin", action="store_true",
                            help="read the password from the first line of stdin instead of generating one")

    def handle(self, *args: Any, **opts: Any) -> None:
        generated = not opts["password_stdin"]
        password = secrets.token_urlsafe(18) if generated else sys.stdin.readline().rstrip("\n")
        if not password:
            raise CommandError("an empty password on stdin")
        try:
            user = do_create_user(opts["username"], roles=opts["role"], actor="cli:create_user", password=password)
        except ActionError as exc:
            raise CommandError(str(exc)) from None
        self.stderr.write(f"created user {user.username!r} with role(s) {', '.join(sorted(set(opts['role'])))}"
                          + ("; the password is shown only once:" if generated else ""))
        if generated:
            self.stdout.write(password)
