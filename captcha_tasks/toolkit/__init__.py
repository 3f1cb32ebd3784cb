"""Tools for your own scraping code, on the same Redis as the workers.

* :mod:`.sessions`: one domain's cookies shared by every worker, a session lock, and
  "log in once" (:func:`~.sessions.reauthenticate`);
* :mod:`.proxies`: the shared proxy pool (:class:`~.proxies.ProxyPool`), the same one a
  solve with ``proxy="pool"`` takes its proxy from.

Build them from the settings (``CookieStore.from_settings()``, ``ProxyPool.from_settings()``)
or from a redis-py client and :class:`~captcha_tasks.state.keys.Keys` of your own.
"""
