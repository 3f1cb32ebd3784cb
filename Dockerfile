FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md celeryconfig.py ./
COPY captcha_tasks ./captcha_tasks
RUN pip install --no-cache-dir . && useradd --create-home app
USER app
CMD ["celery", "-A", "captcha_tasks", "worker", "-P", "threads", "-c", "32", "-l", "INFO"]
