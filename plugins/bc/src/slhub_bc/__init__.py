"""slhub-bc: behavior cloning of a cart-pole LQR controller from state or from images.

Install the distribution and name it in a recipe as ``plugin: bc``; the recipe's
``bc.observation`` chooses ``state`` (MLP) or ``visual`` (CNN on rendered frames).
"""

__version__ = "0.1.0"
