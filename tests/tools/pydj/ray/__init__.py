"""A TEST STAND-IN for Ray (the package ray), NOT Ray: what esd-dj
(daemon/esd-dj.py) uses of it, for tests/tools/pydj's stand-in Data-Juicer.
It starts nothing and connects to nothing."""

_initialized = False


def is_initialized():
    """As Ray's: whether ray.init() ran (it never does here)."""
    return _initialized

# As importing the real Ray does (2.x, seen with .venv's): the warm
# processor's forks must have it as exec'd attempts have it.
import os as _os

_os.environ.setdefault("RAY_CLIENT_MODE", "0")
