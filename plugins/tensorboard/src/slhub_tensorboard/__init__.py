"""slhub-tensorboard: TensorBoard event files for slhub runs.

Install the distribution and list it in a recipe's extra plugins: ``plugins: [tensorboard]``.
"""

__version__ = "0.1.0"
