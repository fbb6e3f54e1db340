"""`polygraphy.backend`: the loaders and runners of Polygraphy's API on polykit's (trt: polykit's
own engine under TensorRT's names; onnxrt: onnxruntime; common: bytes from a file)."""
