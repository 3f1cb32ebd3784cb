# One image for every process of captcha-tasks: worker (default), beat, flower, metrics
# and the development sandbox; docker-compose.yml picks the command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY captcha_tasks ./captcha_tasks
# The redbeat extra lets beat run with a Redis lock (a standby beat); unused otherwise.
RUN pip install ".[redbeat,kafka]" \
    && useradd --create-home --uid 10001 app

# Never root: the workers handle third-party input (captcha images, proxies).
USER app
EXPOSE 5555 8765 9808
CMD ["celery", "-A", "captcha_tasks", "worker", "-P", "threads", "-c", "32", "-l", "INFO"]
