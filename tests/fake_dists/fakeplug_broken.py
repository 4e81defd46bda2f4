"""A plugin module that fails to import, as a broken third-party package would."""

import slhub_dependency_that_does_not_exist  # noqa: F401

Plugin = object
