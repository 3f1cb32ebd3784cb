"""The pingback receiver: provider callbacks complete their captchas (see
:mod:`.callbacks`), served by :mod:`.server` (``captcha-tasks pingback-server``) or
mounted in a Flask or Django app (:meth:`Receiver.handle_request`, :mod:`.wsgi`)."""

from ..serving.limits import Limits
from .callbacks import MAX_BODY, Receiver, Verdict, default_receiver
from .server import PingbackServer, serve
from .wsgi import make_wsgi_app

__all__ = [
    "MAX_BODY",
    "Limits",
    "PingbackServer",
    "Receiver",
    "Verdict",
    "default_receiver",
    "make_wsgi_app",
    "serve",
]
