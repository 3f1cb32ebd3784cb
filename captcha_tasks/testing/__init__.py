"""For your own tests: a local provider, and the processes of a stack to start and kill.

* :mod:`captcha_tasks.testing.sandbox`: :class:`~.sandbox.SandboxServer`, a real
  CaptchaAI-compatible HTTP API (in.php/res.php, and the JSON family's createTask with
  ``kind``) in this process, with threads, solve times, faults, callbacks and a
  ``/siteverify``; configured by :class:`~.sandbox.SandboxConfig`.
* ``captcha-tasks sandbox`` (:mod:`captcha_tasks.testing.cli`): the same as a command,
  one or several providers.
* :mod:`captcha_tasks.testing.processes`: :class:`~.processes.SandboxProcess` (a sandbox
  provider in a process of its own, to SIGKILL and restart on the same port),
  :class:`~.processes.RedisServer` (a throwaway Redis-compatible server) and
  :class:`~.processes.CeleryProcess` (a worker or beat), which ``captcha-tasks quickstart``
  starts too.

Nothing here is imported by the worker or the client: a deployment never loads it.
"""
