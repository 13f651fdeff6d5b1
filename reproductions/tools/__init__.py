"""Checks of the reproduction runner itself (see reproductions/README.md)."""
