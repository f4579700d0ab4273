"""``manage.py create_group NAME [--policy auto|approval|shadow] [--auto-register CIDR_OR_SUFFIX ...]``.

Operators create groups (ingest never does). ``--auto-register`` lists the networks (CIDRs) and DNS
suffixes from which nodes that first appear in ingest data may be registered into the group (with
``AUTO_REGISTER_NODES`` on); on an existing group it replaces the list.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from outlier_admin.control.actions import ActionError, do_create_group, do_set_auto_register
from outlier_admin.fleet.models import ModelGroup, Policy

ACTOR = "cli:create_group"


class Command(BaseCommand):
    help = "Create a model group (or set an existing group's auto-register networks)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("name")
        parser.add_argument("--policy", choices=Policy.values, default=Policy.AUTO)
        parser.add_argument("--model-name", default="")
        parser.add_argument("--hardware-class", default="")
        parser.add_argument("--auto-register", nargs="*", metavar="CIDR_OR_SUFFIX", default=None)
        parser.add_argument("--reason", default="created from the command line")

    def handle(self, *args: Any, **opts: Any) -> None:
        existing = ModelGroup.objects.filter(name=opts["name"]).first()
        try:
            if existing is None:
                group = do_create_group(
                    opts["name"], actor=ACTOR, reason=opts["reason"], policy=opts["policy"],
                    model_name=opts["model_name"], hardware_class=opts["hardware_class"],
                    auto_register_allow=opts["auto_register"] or [],
                )
                self.stdout.write(f"created group {group.name} (policy {group.policy})")
            elif opts["auto_register"] is not None:
                group = do_set_auto_register(existing, opts["auto_register"], actor=ACTOR, reason=opts["reason"])
                self.stdout.write(f"group {group.name}: auto-register from {group.auto_register_allow or 'the default'}")
            else:
                raise CommandError(f"group {opts['name']!r} already exists")
        except ActionError as exc:
            raise CommandError(str(exc)) from None
