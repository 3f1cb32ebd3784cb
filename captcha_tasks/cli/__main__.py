"""``python -m captcha_tasks.cli``."""

from . import main

main()
