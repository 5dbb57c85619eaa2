"""Former home of the plan schema; kept so that ``from autoparallel._plan import ...`` still
works. The plan lives in ``autoparallel.plan``."""

from autoparallel.plan import *  # noqa: F403 - the same names, re-exported
from autoparallel.plan import __all__  # noqa: F401
