from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0007_apitoken_ingest_groups"),
    ]

    operations = [
        migrations.AddField(
            model_name="modelgroup",
            name="decision_signal",
            field=models.CharField(blank=True, db_default="", default="", max_length=16),
        ),
        migrations.AddField(
            model_name="modelgroup",
            name="safeguard_limit",
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="modelgroup",
            name="safeguard_counted",
            field=models.IntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="modelgroup",
            name="safeguard_held",
            field=models.IntegerField(db_default=0, default=0),
        ),
    ]
