from django.apps import AppConfig


class CaptchasConfig(AppConfig):
    name = "captchas"
