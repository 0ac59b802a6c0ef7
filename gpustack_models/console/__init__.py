"""The admin console: a read-only view of the mirror for operators (dashboard, tenants, nodes, artifacts)."""
