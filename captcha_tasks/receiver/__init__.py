"""The pingback receiver: provider callbacks complete their captchas (see
:mod:`.callbacks`), served by :mod:`.wsgi` or mounted in a Flask or Django app."""

from .callbacks import MAX_BODY, Receiver, Verdict, default_receiver
from .wsgi import make_wsgi_app, serve

__all__ = ["MAX_BODY", "Receiver", "Verdict", "default_receiver", "make_wsgi_app", "serve"]
