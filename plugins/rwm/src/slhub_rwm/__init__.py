"""slhub-rwm: a Robotic World Model (Li, Krause & Hutter 2025) as an slhub plugin.

Install the distribution and name it in a recipe as ``plugin: rwm``.
"""

__version__ = "0.1.0"
