"""The attack suite: a package so that its conftest does not shadow tests/server/conftest.py."""
