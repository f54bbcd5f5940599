"""``python -m pylog.cli``: the ``pylog`` command, as ``python -m pylog`` (see :mod:`pylog.cli`)."""
from pylog.cli import main

if __name__ == "__main__":
    main()
