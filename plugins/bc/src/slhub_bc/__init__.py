"""slhub-bc: state and visual behavior cloning from any dataset slhub reads.

Install the distribution and name it in a recipe as ``plugin: bc``; the recipe's
``bc.observation`` chooses ``state`` (an MLP on the observation role) or ``visual`` (a
CNN per camera of the image role), and ``data`` names the dataset and its features.
Without ``data.path`` it trains on an LQR cart-pole expert's demonstrations.
"""

__version__ = "0.1.0"
