from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("lending", "0002_request_id"),
    ]

    operations = [
        migrations.AddField(
            model_name="offloaddecision",
            name="key_name",
            field=models.CharField(
                blank=True,
                help_text=(
                    "The stored API key the request came with (its owner's, when lent); null "
                    "for rows about no request and for requests without a stored key."
                ),
                max_length=200,
                null=True,
            ),
        ),
    ]
