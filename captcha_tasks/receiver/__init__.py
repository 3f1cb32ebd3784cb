"""The pingback receiver: provider callbacks complete their captchas (see
:mod:`.callbacks`), served by :mod:`.wsgi` or mounted in a Flask or Django app."""

from .callbacks import Receiver, Verdict
from .wsgi import make_wsgi_app, serve

__all__ = ["Receiver", "Verdict", "make_wsgi_app", "serve"]
