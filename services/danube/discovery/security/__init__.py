"""The security admin: roles, bindings, API keys (docs/security.md)."""
