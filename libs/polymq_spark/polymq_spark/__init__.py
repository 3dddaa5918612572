"""The PySpark data source (format ``"polymq"``) that writes DataFrames to the Avro frontend.

::

    from polymq_spark import register
    register(spark)
    (df.write.format("polymq")
        .option("url", "http://127.0.0.1:8083")
        .option("destination", "stream/events")
        .mode("append").save())

Each row becomes one message (Avro single-object encoding, the schema derived from the
DataFrame's: :mod:`polymq_spark.schema`); rows go in idempotent batches whose ids are
deterministic, so Spark's task retries and re-run micro-batches publish nothing twice
(:mod:`polymq_spark.task`). Options: :mod:`polymq_spark.options`. ``polymq spark-push``
(:mod:`polymq_spark.cli`) does the same for a Parquet, CSV or JSON file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import (
    DeliveryError,
    EncodingError,
    InjectedFailure,
    OptionError,
    PolymqSparkError,
    UnsupportedTypeError,
)
from .options import WriteOptions, parse_options
from .schema import avro_schema
from .source import PolymqDataSource, PolymqStreamWriter, PolymqWriter

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "DeliveryError",
    "EncodingError",
    "InjectedFailure",
    "OptionError",
    "PolymqDataSource",
    "PolymqSparkError",
    "PolymqStreamWriter",
    "PolymqWriter",
    "UnsupportedTypeError",
    "WriteOptions",
    "avro_schema",
    "parse_options",
    "register",
]


def register(spark: SparkSession) -> None:
    """Make ``format("polymq")`` known to ``spark`` (for both ``write`` and ``writeStream``)."""
    spark.dataSource.register(PolymqDataSource)
