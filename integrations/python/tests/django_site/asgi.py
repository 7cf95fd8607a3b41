import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_site.settings")
# read by settings.py: under ASGI every request runs in a thread of its own, so no persistent connections
os.environ["RL_DJANGO_ASGI"] = "1"
application = get_asgi_application()
