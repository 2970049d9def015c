"""Helpers shared by the test packages, imported by module name (tests.helpers.<name>)."""
