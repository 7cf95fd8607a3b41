from django.urls import path

from routes import ok_paths

from . import views

urlpatterns = [
    *[path(p.lstrip("/"), views.ok) for p in ok_paths()],
    path("api/<str:name>", views.ok),
    path("slow", views.slow),
    path("ai", views.ai),
    path("bill", views.ai),
    path("pai", views.ai_async),
    path("counts", views.counts),
    path("runs", views.run_counts),
    path("fail", views.fail),
    path("pfail", views.fail),
    path("sms", views.fail),
    path("refund/<str:order>", views.fail),
    path("decorated", views.decorated),
    path("decorated_async", views.decorated_async),
]
