"""``python manage.py migrate_redis_keys [--dry-run]``: rename a group's Redis keys from the layout before
hash tags (``outlier:stream:<group>``, ...) to :mod:`contract.keys`'s (``outlier:{<group>}:stream``, ...),
once, at the upgrade, on the single Redis (or Sentinel primary) the control plane used.

Why: the stream holds entries no tick applied yet (and its consumer group, their delivery state), the
state holds the detector's checkpoint; left under the old names they are orphaned, and the first tick
after the upgrade starts a fresh detector without them. Run it with the control plane stopped (ticks and
ingest write the new names as soon as they run); the weights document needs nothing (the upgraded
control plane writes both names, see the agent README's "Key migration"). ``RENAME`` is atomic and keeps
a stream's consumer groups; a key whose new name already exists is left alone and reported. A Redis
Cluster needs no migration (the previous release did not run on one) and is refused."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from contract import keys
from contract.topology import is_cluster
from outlier_admin.control.redis_conn import get_redis


def renames(r: Any, group: str) -> list[tuple[str, str]]:
    """``[(old, new), ...]`` for ``group``: the keys present under their old name only."""
    pairs = [(old, new) for new, old in keys.pre_cluster_names(group).items()]
    for raw in r.scan_iter(match=keys.pre_cluster_dedup_pattern(group), count=1000):
        old = raw.decode()
        window = old.rsplit(":", 1)[1]
        if window.lstrip("-").isdigit():
            pairs.append((old, keys.dedup(group, int(window))))
    return [(old, new) for (old, new), there in zip(pairs, _exists(r, [o for o, _ in pairs]), strict=True) if there]


def _exists(r: Any, names: list[str]) -> list[bool]:
    pipe = r.pipeline(transaction=False)
    for name in names:
        pipe.exists(name)
    return [bool(x) for x in pipe.execute()]


class Command(BaseCommand):
    help = "Rename the groups' Redis keys to the hash-tagged layout of contract/keys.py (once, at the upgrade)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--dry-run", action="store_true", help="list the renames, change nothing")

    def handle(self, *args: Any, **opts: Any) -> None:
        from outlier_admin.fleet.models import ModelGroup

        r = get_redis()
        if is_cluster(r):
            raise CommandError("REDIS_URL is a Redis Cluster: nothing to migrate (the old layout ran on a single "
                               "Redis; migrate there before moving the data to the cluster)")
        moved = kept = 0
        for group in ModelGroup.objects.order_by("name").values_list("name", flat=True):
            for old, new in renames(r, group):
                if opts["dry_run"]:
                    self.stdout.write(f"would rename {old} -> {new}")
                    moved += 1
                elif r.renamenx(old, new):
                    moved += 1
                else:
                    kept += 1
                    self.stdout.write(f"kept {old}: {new} exists already (written since the upgrade)")
        verb = "would rename" if opts["dry_run"] else "renamed"
        self.stdout.write(f"{verb} {moved} key(s); {kept} left under the old name")
