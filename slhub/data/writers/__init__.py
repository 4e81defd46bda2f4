"""Dataset writers for formats other than slhub's own store (:func:`slhub.data.write_store`)."""
