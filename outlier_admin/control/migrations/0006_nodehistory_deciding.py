from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("control", "0005_outcomes_silences"),
    ]

    operations = [
        migrations.AddField(
            model_name="nodehistory",
            name="deciding",
            field=models.BooleanField(db_default=False, default=False),
        ),
    ]
