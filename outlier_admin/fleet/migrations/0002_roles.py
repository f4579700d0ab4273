"""Data migration: the three operator roles. The API enforces them:

- ``viewer``: read everything.
- ``operator``: viewer + thresholds, group policy and proposal decisions (approve / reject).
- ``oncall``: viewer + manual overrides (quarantine / release / pin).
"""

from django.db import migrations

ROLES = ("viewer", "operator", "oncall")


def create_roles(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for name in ROLES:
        Group.objects.get_or_create(name=name)


def drop_roles(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=ROLES).delete()


class Migration(migrations.Migration):
    dependencies = [("fleet", "0001_initial"), ("auth", "0012_alter_user_first_name_max_length")]
    operations = [migrations.RunPython(create_roles, drop_roles)]
