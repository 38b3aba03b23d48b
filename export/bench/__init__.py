"""seer-bench: interleaved rounds and their ratios, the fixture scenarios, the cache workload, C++ vs Python."""
