"""The ``polymq`` command line: one entry point for every service."""
