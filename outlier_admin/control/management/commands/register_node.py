"""``manage.py register_node GROUP ADDRESS [--name ID] [--metrics-url URL] [--dcgm-url URL] [--base-weight N]``.

``ADDRESS`` is ``host:port`` or ``http(s)://host:port`` (the canary probes ``<address>/v1/completions``);
``--name`` is the node id the gateways' records use (default: the address).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from outlier_admin.control.actions import ActionError, do_register_node
from outlier_admin.fleet.models import ModelGroup


class Command(BaseCommand):
    help = "Register a node in a group."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("group")
        parser.add_argument("address")
        parser.add_argument("--name", default=None)
        parser.add_argument("--metrics-url", default="")
        parser.add_argument("--dcgm-url", default="")
        parser.add_argument("--base-weight", type=int, default=100)
        parser.add_argument("--reason", default="registered from the command line")

    def handle(self, *args: Any, **opts: Any) -> None:
        group = ModelGroup.objects.filter(name=opts["group"]).first()
        if group is None:
            raise CommandError(f"no group {opts['group']!r} (create it with manage.py create_group)")
        try:
            node = do_register_node(
                group, opts["address"], actor="cli:register_node", name=opts["name"], reason=opts["reason"],
                metrics_url=opts["metrics_url"], dcgm_url=opts["dcgm_url"], base_weight=opts["base_weight"],
            )
        except ActionError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"registered {node.name} ({node.address}) in {group.name}")
