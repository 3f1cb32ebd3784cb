"""The providers' HTTP APIs, as clients: they speak HTTP and turn replies into values and
typed errors, and decide nothing.

* :mod:`.inphp`: the ``in.php`` / ``res.php`` protocol (CaptchaAI, 2captcha):
  :class:`~.inphp.CaptchaAIClient`, and :class:`~.inphp.ProviderAPI`, the interface every
  provider's client satisfies;
* :mod:`.jsonapi`: the JSON family (``createTask`` / ``getTaskResult``: Anti-Captcha,
  CapSolver, CapMonster), and :func:`~.jsonapi.api_for`, which picks a provider's client by
  its kind.

The gateway serves the same two protocols (``gateway/inphp``, ``gateway/jsonapi``).
"""
