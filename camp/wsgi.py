import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "camp.settings")
application = get_wsgi_application()

from camp.heap import freeze_web_app  # noqa: E402

freeze_web_app()  # the loaded app is never garbage: full collections skip it (camp.heap)
