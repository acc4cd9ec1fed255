"""Minimal stand-in for the parts of diffusers the DreamZero reference imports (see ../README.md)."""
