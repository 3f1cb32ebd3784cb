"""The gateway: the provider APIs an SDK already speaks (2captcha's and CaptchaAI's
``in.php`` / ``res.php``, Anti-Captcha's and CapMonster's JSON), answered by this
deployment's workers, so any SDK in any language shares the account by changing one host
name (``captcha-tasks gateway``).

* :mod:`.site`: who may call and the order a request is judged in, on the HTTP server
  core the receiver shares (:mod:`captcha_tasks.serving`);
* :mod:`.tenants`: tenants are keys (``key_env`` in ``CAPTCHAAI_TENANTS``), and their
  request rates;
* :mod:`.service`: what a request does (a ``solve``, a pooled token, an answer read from
  the result backend, a report, the balance, the threads);
* :mod:`.inphp` and :mod:`.jsonapi`: the two faces; :mod:`.tasktypes`: the JSON face's
  task types; :mod:`.forms`: reading bodies; :mod:`.server`, :mod:`.cli`: the process;
* :mod:`.delivery`: a client's own callback (``pingback``, ``callbackUrl``), sent by a
  worker (every worker registers its task).
"""

from .server import GatewayServer, serve
from .service import Gateway
from .site import MAX_BODY, GatewaySite
from .tenants import TenantKeys

__all__ = ["MAX_BODY", "Gateway", "GatewayServer", "GatewaySite", "TenantKeys", "serve"]
