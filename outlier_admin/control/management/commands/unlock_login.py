"""``manage.py unlock_login USERNAME [--ip ADDRESS] --reason TEXT`` | ``manage.py unlock_login --list``.

Ends a login lockout now (the throttle keys on username and client address together:
:mod:`outlier_admin.fleet.login_throttle`), audited as ``login.unlock`` through
:func:`outlier_admin.control.actions.do_unlock_login`. Without ``--ip`` every address's failures for
the username are cleared. ``--list`` prints the pairs locked out now, one per line.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from outlier_admin.control.actions import ActionError, do_unlock_login
from outlier_admin.fleet.login_throttle import locked_out


class Command(BaseCommand):
    help = "End a login lockout (audited), or --list the lockouts in force."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("username", nargs="?")
        parser.add_argument("--ip", default=None, help="only this client address's failures")
        parser.add_argument("--reason", default=None, help="why (goes into the audit log)")
        parser.add_argument("--list", action="store_true", help="print the lockouts in force and exit")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["list"]:
            for p in locked_out():
                self.stdout.write(f"{p['username']}\t{p['ip_address']}\t{p['failures']} failures\t"
                                  f"until {p['until']:%Y-%m-%d %H:%M:%S} UTC")
            return
        if not opts["username"] or not opts["reason"]:
            raise CommandError("give a USERNAME and --reason (or --list)")
        try:
            cleared = do_unlock_login(opts["username"], ip_address=opts["ip"], actor="cli:unlock_login",
                                      reason=opts["reason"])
        except ActionError as exc:
            raise CommandError(str(exc)) from None
        where = f" at {opts['ip']}" if opts["ip"] else ""
        self.stdout.write(f"unlocked {opts['username']!r}{where}: {cleared} failures cleared")
