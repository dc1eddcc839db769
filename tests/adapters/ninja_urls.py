"""The demo project's URLs with the Ninja APIs of tests/adapters/ninja_api.py mounted."""

from django.urls import path

from project.urls import urlpatterns as project_urlpatterns
from tests.adapters.ninja_api import api, parts

urlpatterns = [
    *project_urlpatterns,
    path("ninja/", api.urls),
    path("ninja-parts/", parts.urls),
]
