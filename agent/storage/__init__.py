"""Durable segment replica storage."""
