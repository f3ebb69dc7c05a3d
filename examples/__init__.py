"""Runnable examples, one folder each."""
