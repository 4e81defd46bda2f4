"""slhub-wandb: Weights & Biases logging for slhub runs.

Install the distribution and list it in a recipe's extra plugins: ``plugins: [wandb]``.
"""

__version__ = "0.1.0"
