from django.contrib import admin
from django.urls import include, path

from project.demo import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("project.demo.api_urls")),
    path("demo/", include("project.demo.urls")),  # the receiver of the alert webhooks
    path("ratelimit/", include("ratelimit_app.urls")),  # usage endpoint; Prometheus (off by default)
    path("hello/", views.hello, name="hello"),
    path("health/", views.health, name="health"),
]
