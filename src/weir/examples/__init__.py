"""Runnable examples (``python -m weir.examples.fraud_demo``)."""
