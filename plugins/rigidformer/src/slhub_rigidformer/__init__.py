"""slhub-rigidformer: rigid-body dynamics with a transformer over object tokens.

Install the distribution and name it in a recipe as ``plugin: rigidformer``.
"""

__version__ = "0.1.0"
