"""The Flask app's Celery app, for ``celery -A make_celery worker -Q flask``."""

from flask_app import create_app

flask_app = create_app()
celery_app = flask_app.extensions["celery"]
