import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "camp.settings")
application = get_wsgi_application()

from camp.heap import freeze_startup_heap, import_urlconf  # noqa: E402

import_urlconf()
freeze_startup_heap()  # the loaded app is never garbage: full collections skip it (camp.heap)
