"""The demo: tiny offline models and a project built on them (fixtures for tests too)."""
