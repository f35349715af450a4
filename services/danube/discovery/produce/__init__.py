"""The proxy path's produce (routing, bus requests to ingest) and producer sessions and epochs."""
