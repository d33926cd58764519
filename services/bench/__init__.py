"""Benchmarks: each module measures a scenario next to its baseline in the same run."""
