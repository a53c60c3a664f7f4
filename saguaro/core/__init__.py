"""Types that the engine and the speculation strategies share and neither owns."""
