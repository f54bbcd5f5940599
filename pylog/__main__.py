"""``python -m pylog``: the ``pylog`` command (see :mod:`pylog.cli`)."""
from pylog.cli import main

if __name__ == "__main__":
    main()
