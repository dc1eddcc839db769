"""Standard Webhooks: each endpoint's signature scheme, and its secret in the standard's form.

The endpoints that exist sign the new way and the former way both ("both"), so a receiver
still checking X-Ratelimit-Signature keeps accepting every delivery, pending ones included;
new endpoints sign the standard way only. Each former secret ``s`` is wrapped as
``"whsec_" + base64(s)``: its key is ``s`` itself, so the former signature does not change, and a
receiver holding ``s`` computes the wrapped form to verify the standard headers (CHANGELOG.md).
"""

import base64

from django.db import migrations, models


def wrap_secrets(apps, schema_editor):
    endpoints = apps.get_model("ratelimit_app", "WebhookEndpoint")
    for endpoint in endpoints.objects.all():
        endpoint.secret = "whsec_" + base64.b64encode(endpoint.secret.encode()).decode()
        endpoint.save(update_fields=["secret"])


def unwrap_secrets(apps, schema_editor):
    endpoints = apps.get_model("ratelimit_app", "WebhookEndpoint")
    for endpoint in endpoints.objects.filter(signature_scheme="both"):
        former = base64.b64decode(endpoint.secret.removeprefix("whsec_"))
        endpoint.secret = former.decode()
        endpoint.save(update_fields=["secret"])


class Migration(migrations.Migration):

    dependencies = [
        ('ratelimit_app', '0018_ip_alerts_aggregated'),
    ]

    operations = [
        # the endpoints that exist: both schemes
        migrations.AddField(
            model_name='webhookendpoint',
            name='signature_scheme',
            field=models.CharField(default='both', max_length=10, verbose_name='signature'),
        ),
        migrations.RunPython(wrap_secrets, unwrap_secrets),
        # new endpoints: the standard alone
        migrations.AlterField(
            model_name='webhookendpoint',
            name='signature_scheme',
            field=models.CharField(choices=[('standard', 'Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature)'), ('both', 'Standard Webhooks and the former X-Ratelimit-Signature (while a receiver made before 0.2.0 moves over)')], default='standard', help_text='How deliveries are signed. Endpoints added before 0.2.0 send both; choose Standard Webhooks once the receiver verifies those headers.', max_length=10, verbose_name='signature'),
        ),
    ]
