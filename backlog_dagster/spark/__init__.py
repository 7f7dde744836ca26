"""Spark over the log: the ``bucketlog`` data source and the session that registers it.

Nothing here imports pyspark at package import time; import the submodules when Spark
is about to run.
"""
