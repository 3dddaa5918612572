"""Avro over HTTP: container files and single-object records, a schema registry."""
