"""URLs of the example project: the Django admin, where the outbox tables can be browsed."""

from django.contrib import admin
from django.urls import path

urlpatterns = [
    path("admin/", admin.site.urls),
]
