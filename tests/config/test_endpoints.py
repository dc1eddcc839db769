"""URLconf introspection: the endpoints the admin offers are the names the limiter sees."""

import pytest
from django.contrib import admin
from django.contrib.admin import AdminSite
from django.http import HttpResponse
from django.urls import include, path, re_path, resolve
from rest_framework import routers, viewsets
from rest_framework.response import Response
from rest_framework.urlpatterns import format_suffix_patterns

from project.demo.views import ItemList
from ratelimit_app.config.endpoints import (
    endpoint_names,
    find_endpoint,
    limited_endpoints,
    list_endpoints,
)
from ratelimit_app.runtime.guard import endpoint_name


def plain_view(request, **kwargs):
    return HttpResponse("ok")


class ThingViewSet(viewsets.ViewSet):
    def list(self, request):
        return Response([])

    def create(self, request):
        return Response({})

    def retrieve(self, request, pk=None):
        return Response({})

    def destroy(self, request, pk=None):
        return Response({})


# DRF routers write regex patterns: ^things/(?P<pk>[^/.]+)/$ and format-suffix variants
router = routers.DefaultRouter()
router.register("things", ThingViewSet, basename="thing")
simple_router = routers.SimpleRouter()
simple_router.register("parts", ThingViewSet, basename="part")

# A URLconf with the awkward cases (used through pytest.mark.urls below).
ops_admin = AdminSite(name="ops_admin")
inner = ([path("thing/<int:pk>/", plain_view, name="thing")], "inner")
outer = ([path("in/", include(inner)), path("nameless/", plain_view)], "outer")
urlpatterns = [
    path("admin/", admin.site.urls),
    path("ops/", ops_admin.urls),
    path("v1/", include(outer)),
    re_path(r"^legacy/(?P<year>[0-9]{4})/$", plain_view, name="legacy"),
    *format_suffix_patterns([path("items/", ItemList.as_view(), name="items")]),
    path("api/", include((router.urls, "api"))),
    path("nested/<int:group>/", include((simple_router.urls, "nested"))),
]


def test_demo_project_endpoints_are_offered_with_route_and_view_name():
    by_name = {e.name: e for e in list_endpoints()}
    assert {"api:items", "api:search", "api:reports", "hello", "health"} <= set(by_name)
    assert by_name["api:items"].route == "/api/items/"
    assert by_name["api:items"].label == "api:items — GET /api/items/ (Item List)"
    assert by_name["api:reports"].methods == ("POST",)
    assert by_name["hello"].label == "hello — /hello/ (project.demo.views.hello)"


def test_exempt_endpoints_are_marked_and_left_out_of_the_limited_ones(settings):
    exempt = {e.name for e in list_endpoints() if e.exempt}
    # /health is under EXEMPT_PATHS; the usage, usage records, credits and metrics views and
    # the demo's webhook receiver are @ratelimit_exempt
    staff_views = {"ratelimit_app:usage", "ratelimit_app:usage-records",
                   "ratelimit_app:credit-balance", "ratelimit_app:credit-top-ups",
                   "ratelimit_app:prometheus"}
    assert exempt == {"health", "demo:webhook-receiver", *staff_views}
    assert exempt <= endpoint_names()  # still endpoints: rows naming them are not "missing"
    assert not exempt & {e.name for e in limited_endpoints()}
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "EXEMPT_PATHS": ["/hello", "/api/"]}
    # the setting is read at each listing; a DRF view stays limited by QuotaThrottle anyway
    # (api:generate, a plain view under /api/, does not)
    assert {e.name for e in list_endpoints() if e.exempt} == \
        {"hello", "api:generate", "demo:webhook-receiver", *staff_views}


def test_admin_urls_are_never_offered():
    assert not [name for name in endpoint_names() if name.startswith("admin:")]


@pytest.mark.urls("tests.config.test_endpoints")
def test_nested_namespaces_regex_routes_and_unnamed_views():
    names = [e.name for e in list_endpoints()]
    assert names == sorted(names)
    assert set(names) - {n for n in names if n.startswith(("api:", "nested:"))} == {
        "outer:inner:thing", "outer:tests.config.test_endpoints.plain_view", "legacy", "items",
    }  # both admin sites left out
    assert find_endpoint("outer:inner:thing").route == "/v1/in/thing/<int:pk>/"
    assert find_endpoint("legacy").route == "/legacy/<year>/"
    assert find_endpoint("nope") is None


@pytest.mark.urls("tests.config.test_endpoints")
def test_drf_router_routes_read_as_routes_with_their_methods():
    labels = {e.name: e.label for e in list_endpoints() if e.name.startswith(("api:", "nested:"))}
    assert labels == {
        "api:api-root": "api:api-root — GET /api/ (Api Root)",
        "api:thing-list": "api:thing-list — GET, POST /api/things/ (Thing List)",
        "api:thing-detail": "api:thing-detail — GET, DELETE /api/things/<pk>/ (Thing Instance)",
        "nested:part-list": "nested:part-list — GET, POST /nested/<int:group>/parts/ (Thing List)",
        "nested:part-detail":
            "nested:part-detail — GET, DELETE /nested/<int:group>/parts/<pk>/ (Thing Instance)",
    }


@pytest.mark.urls("tests.config.test_endpoints")
def test_format_suffix_duplicates_are_listed_once():
    assert [e.name for e in list_endpoints()].count("items") == 1
    assert find_endpoint("items").view == "Item List"


@pytest.mark.urls("tests.config.test_endpoints")
@pytest.mark.parametrize("url", ["/v1/in/thing/7/", "/v1/nameless/", "/legacy/2024/",
                                 "/items/", "/items.json", "/api/things/", "/api/things/7/",
                                 "/nested/3/parts/7/"])
def test_offered_names_are_the_names_the_limiter_sees(rf, url):
    request = rf.get(url)
    request.resolver_match = resolve(url)
    assert endpoint_name(request) in endpoint_names()
