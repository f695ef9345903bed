"""Benchmarks: named suites of problems, a GPU timing runner, reports."""
