"""Group names may be Hugging Face model ids (``/``, ``.``, ``@``, up to 200 characters); pages and
API routes name a group by its slug. Every existing name is already a slug, so it becomes its own
slug and no URL changes."""

from django.db import migrations, models


def slug_is_name(apps, schema_editor):
    ModelGroup = apps.get_model("fleet", "ModelGroup")
    for group in ModelGroup.objects.all().only("pk", "name"):
        ModelGroup.objects.filter(pk=group.pk).update(slug=group.name)


class Migration(migrations.Migration):

    dependencies = [
        ("fleet", "0004_group_auto_register_allow"),
    ]

    operations = [
        migrations.AlterField(
            model_name="modelgroup",
            name="name",
            field=models.CharField(
                help_text="Group id used in records, Redis keys and metrics (fleet.names)", max_length=200, unique=True
            ),
        ),
        migrations.AddField(
            model_name="modelgroup",
            name="slug",
            field=models.SlugField(help_text="URL segment of the group", max_length=220, null=True, db_index=False),
        ),
        migrations.RunPython(slug_is_name, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="modelgroup",
            name="slug",
            field=models.SlugField(help_text="URL segment of the group", max_length=220, unique=True),
        ),
    ]
