"""Estimates computed from step profiles and the catalog: pure Python, never torch."""
