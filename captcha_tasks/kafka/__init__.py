"""The optional Kafka bridge (``pip install 'captcha-tasks[kafka]'``)."""
