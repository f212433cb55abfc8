"""Runtimes that host operators: shared operator core, Spark, continuous."""
