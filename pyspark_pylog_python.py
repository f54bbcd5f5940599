"""Spark finds the Python source under the name ``pylog-python`` through this module (its
``DefaultSource``): the JVM connector hands its writes there (docs/spark.md)."""
from pylog.spark import PylogPythonDataSource as DefaultSource  # noqa: F401
