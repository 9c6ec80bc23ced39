"""Exports of seqlm models to other runtimes: `seqlm export DIR --onnx OUT.onnx` (seqlm.export.onnx), and the
onnxruntime reader that scores text with such a file as seqlm does (seqlm.export.runtime)."""
