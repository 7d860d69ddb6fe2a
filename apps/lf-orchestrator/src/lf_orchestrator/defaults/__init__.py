"""Embedded default configs."""
