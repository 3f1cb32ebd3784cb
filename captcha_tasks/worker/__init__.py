"""The Celery side: the app, the tasks, and the adapter between step decisions and Celery."""
