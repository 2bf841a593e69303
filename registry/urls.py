from django.urls import path

from . import views

app_name = "registry"

urlpatterns = [
    path("images/", views.image_list, name="images"),
    path("images/<int:pk>/delete/", views.image_delete, name="image-delete"),
    path("registries/", views.registry_list, name="registries"),
    path("registries/<int:pk>/delete/", views.registry_delete, name="registry-delete"),
]
