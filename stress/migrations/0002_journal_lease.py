from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("stress", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="journal",
            name="slow",
            field=models.BooleanField(default=False, help_text="in flight when SIGTERM was sent"),
        ),
        migrations.AddField(
            model_name="journal",
            name="token",
            field=models.CharField(default="", max_length=32),
        ),
        migrations.AddField(
            model_name="journal",
            name="holder",
            field=models.CharField(default="", max_length=128),
        ),
    ]
