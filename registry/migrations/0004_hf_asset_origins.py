from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("registry", "0003_model_assets"),
    ]

    operations = [
        migrations.CreateModel(
            name="HfAssetOrigin",
            fields=[
                ("sha256", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("repository", models.CharField(max_length=200)),
                ("repository_path", models.CharField(max_length=1000)),
                ("commit", models.CharField(max_length=64)),
                ("bound_at", models.DateTimeField()),
            ],
            options={"db_table": "model_asset_hf_origins"},
        ),
    ]
