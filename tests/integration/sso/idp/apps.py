from django.apps import AppConfig


class IdpConfig(AppConfig):
    name = "tests.integration.sso.idp"
    label = "idp"
