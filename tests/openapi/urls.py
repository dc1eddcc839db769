"""tests.adapters.ninja_urls with drf-spectacular's schema and Swagger UI, and the static files
(DEBUG) both Swagger UIs load."""

from django.contrib.staticfiles.urls import staticfiles_urlpatterns
from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from tests.adapters.ninja_urls import urlpatterns as ninja_urlpatterns

urlpatterns = [
    *ninja_urlpatterns,
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("schema/swagger/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger"),
    *staticfiles_urlpatterns(),
]
