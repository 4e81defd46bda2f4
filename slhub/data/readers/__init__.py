"""Readers of the field's dataset formats, each an :class:`slhub.data.EpisodeDataset`
registered by format name in the entry-point group ``slhub.datasets`` (pyproject.toml).

Each imports its format's library (pyarrow, PyAV, h5py, zarr) only when it opens a
dataset, so a missing library is one line naming the extra to install.
"""
