"""The `danube` command line."""
