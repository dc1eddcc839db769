"""URLconf introspection: the endpoints the admin offers are the names the limiter sees."""

import pytest
from django.contrib import admin
from django.contrib.admin import AdminSite
from django.http import HttpResponse
from django.urls import include, path, re_path, resolve
from rest_framework.urlpatterns import format_suffix_patterns

from project.demo.views import ItemList
from ratelimit_app.endpoints import endpoint_names, find_endpoint, list_endpoints
from ratelimit_app.guard import endpoint_name


def plain_view(request, **kwargs):
    return HttpResponse("ok")


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
]


def test_demo_project_endpoints_are_offered_with_route_and_view_name():
    by_name = {e.name: e for e in list_endpoints()}
    assert {"api:items", "api:search", "api:reports", "hello", "health"} <= set(by_name)
    assert by_name["api:items"].route == "/api/items/"
    assert by_name["api:items"].label == "api:items — /api/items/ (Item List; GET)"
    assert by_name["api:reports"].methods == ("POST",)
    assert by_name["hello"].label == "hello — /hello/ (project.demo.views.hello)"


def test_admin_urls_are_never_offered():
    assert not [name for name in endpoint_names() if name.startswith("admin:")]


@pytest.mark.urls("tests.test_endpoints")
def test_nested_namespaces_regex_routes_and_unnamed_views():
    names = [e.name for e in list_endpoints()]
    assert names == sorted(names)
    assert set(names) == {"outer:inner:thing", "outer:tests.test_endpoints.plain_view",
                          "legacy", "items"}  # both admin sites left out
    assert find_endpoint("outer:inner:thing").route == "/v1/in/thing/<int:pk>/"
    assert find_endpoint("legacy").route == "/legacy/(?P<year>[0-9]{4})/"
    assert find_endpoint("nope") is None


@pytest.mark.urls("tests.test_endpoints")
def test_format_suffix_duplicates_are_listed_once():
    assert [e.name for e in list_endpoints()].count("items") == 1
    assert find_endpoint("items").view == "Item List"


@pytest.mark.urls("tests.test_endpoints")
@pytest.mark.parametrize("url", ["/v1/in/thing/7/", "/v1/nameless/", "/legacy/2024/",
                                 "/items/", "/items.json"])
def test_offered_names_are_the_names_the_limiter_sees(rf, url):
    request = rf.get(url)
    request.resolver_match = resolve(url)
    assert endpoint_name(request) in endpoint_names()
