"""pytest-benchmark suites. Run: pytest bench/ --benchmark-only [--benchmark-json out.json]."""
