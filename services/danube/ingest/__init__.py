"""The ingest service: owns the WAL of its topic partitions, assigns offsets, serves WAL reads."""
