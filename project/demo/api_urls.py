from django.urls import path

from . import views

app_name = "api"

urlpatterns = [
    path("items/", views.ItemList.as_view(), name="items"),
    path("search/", views.Search.as_view(), name="search"),
    path("reports/", views.Reports.as_view(), name="reports"),
    path("generate/", views.generate, name="generate"),
]
