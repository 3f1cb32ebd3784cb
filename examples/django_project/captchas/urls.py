from django.urls import path

from . import views

urlpatterns = [
    path("captchas/", views.start_solve, name="start-solve"),
    path("captchas/<str:task_id>/", views.solve_status, name="solve-status"),
    path("add/", views.start_add, name="start-add"),
    path("captcha/pingback/<str:ticket>", views.pingback, name="pingback"),
    path("add/<str:task_id>/", views.add_result, name="add-result"),
]
