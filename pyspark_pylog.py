from pylog.spark import PylogDataSource as DefaultSource  # noqa: F401
