"""Minimal stand-in for hydra: only hydra.utils.instantiate (see ../README.md)."""
