from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0002_model_states"),
    ]

    operations = [
        migrations.CreateModel(
            name="ModelAsset",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("sha256", models.CharField(db_index=True, max_length=64)),
                ("filename", models.CharField(max_length=255)),
                ("size", models.BigIntegerField()),
                ("path", models.TextField()),
                ("verification_source", models.CharField(max_length=32)),
                ("verified_at", models.DateTimeField()),
            ],
            options={
                "db_table": "model_assets",
                "constraints": [
                    models.UniqueConstraint(fields=("sha256", "path"), name="uniq_model_asset_path")
                ],
            },
        ),
    ]
