"""Example recipes and their plugins (importable as ``examples.<name>.plugin:Object``)."""
