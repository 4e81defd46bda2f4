"""Built-in policy plugins, registered on every run with ``trylast=True`` defaults."""
