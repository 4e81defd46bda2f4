"""The names a NeRD export directory uses, shared by the safetensors writer
(:mod:`~slhub.builtin.nerd.predictor`) and the ONNX writer
(:mod:`~slhub.builtin.nerd.onnx_export`), which must not import each other."""

EXPORT_FORMAT = "slhub.export/1"
KIND = "nerd"
WEIGHTS = "model.safetensors"
MANIFEST = "export.json"
