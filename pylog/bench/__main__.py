"""``python -m pylog.bench [ARGS]``: the comparison benchmark (:mod:`pylog.bench.compare`)."""
import sys

from pylog.bench.compare import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m pylog.bench"))
