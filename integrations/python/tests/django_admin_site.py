"""The operator's page in a Django project of its own, as a user mounts it: Django's full
WSGI handler with the security, common, CSRF and clickjacking middleware, served with
threads by wsgiref on 127.0.0.1 (test_admin.py starts it: python django_admin_site.py
DATABASE EXTENSION; it prints its port)."""
import sys
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.conf import settings

settings.configure(
    DEBUG=False, ALLOWED_HOSTS=["127.0.0.1"], SECRET_KEY="test-only", ROOT_URLCONF=__name__, DATABASES={},
    INSTALLED_APPS=[],
    MIDDLEWARE=["django.middleware.security.SecurityMiddleware", "django.middleware.common.CommonMiddleware",
                "django.middleware.csrf.CsrfViewMiddleware",
                "django.middleware.clickjacking.XFrameOptionsMiddleware"])

import django  # noqa: E402

django.setup()

from django.core.handlers.wsgi import WSGIHandler  # noqa: E402
from django.urls import path  # noqa: E402

from ratelimit_web.admin import AdminView, django_view  # noqa: E402

database, extension = sys.argv[1], sys.argv[2]
admin = AdminView(database, extension=extension, sample_seconds=0.5,
                  authorize=lambda request: "ops=let-me-in" in request.headers.get("cookie", ""))
view = django_view(admin)
urlpatterns = [path("ratelimit/", view), path("ratelimit/<path:rest>", view)]


class Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


httpd = make_server("127.0.0.1", 0, WSGIHandler(), server_class=Server, handler_class=Quiet)
print(httpd.server_port, flush=True)
httpd.serve_forever()
