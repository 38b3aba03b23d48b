"""seer-build's work: TensorRT plans from an export folder. Imports contracts and backends."""
