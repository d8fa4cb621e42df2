"""Policies over the engine: adaptive K."""
