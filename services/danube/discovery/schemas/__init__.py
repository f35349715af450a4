"""The schema registry: subjects, versions, compatibility, topic bindings (docs/schemas.md)."""
