"""Point-to-point transport between the target process and draft workers."""
