"""The PySpark data source (format "polymq") that writes DataFrames to the Avro frontend."""
