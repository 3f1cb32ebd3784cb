"""The test harness: what the test suite and the benchmark scripts (``scripts/``) start
around a deployment and that users never run: a Redis Sentinel cluster, a whole deployment
behind it, a Kafka broker, a connection flood, a self-signed certificate.

It is not part of the package (the wheel leaves it out: ``tests/dev/test_packaging.py``).
The tests import it from the repository's root (pytest's ``pythonpath``); the scripts put
the root on ``sys.path`` first (``scripts/repo_root.py``).  What users may start in their
own tests (the sandbox, Redis, Celery processes) is :mod:`captcha_tasks.testing`.
"""
