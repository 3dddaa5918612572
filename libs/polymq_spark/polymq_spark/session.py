"""A local SparkSession that works in a virtualenv on a loopback-only machine, with format
``"polymq"`` registered: what ``polymq spark-push``, the tests and the benchmark start."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from .source import PolymqDataSource

__all__ = ["local_session"]

LOOPBACK = "127.0.0.1"


def local_session(
    master: str = "local[*]",
    app_name: str = "polymq-spark",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """``SparkSession.builder.master(master)`` bound to 127.0.0.1, without the web UI, with
    Python workers running this interpreter (else they would miss the virtualenv's packages)
    and ``format("polymq")`` registered. ``conf`` adds or overrides settings."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    settings = {
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "ERROR",
        **(conf or {}),
    }
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.dataSource.register(PolymqDataSource)
    return spark
