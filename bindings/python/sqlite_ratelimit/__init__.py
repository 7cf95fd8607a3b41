"""The sqlite ratelimit loadable extension, for Python's sqlite3 (and any SQLite connection
that can load extensions)."""
import os
from importlib.metadata import version as _version

__version__ = _version("sqlite-ratelimit")


def loadable_path():
    """The extension's path without its suffix, as load_extension and `.load` take it."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libratelimit")


def load(conn):
    """Loads the extension into `conn` (a sqlite3.Connection), leaving extension loading
    disabled again afterwards."""
    conn.enable_load_extension(True)
    try:
        conn.load_extension(loadable_path())
    finally:
        conn.enable_load_extension(False)
