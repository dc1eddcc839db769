from django.urls import path

from . import receiver

app_name = "demo"

urlpatterns = [
    path("webhooks/", receiver.receive_webhook, name="webhook-receiver"),
]
