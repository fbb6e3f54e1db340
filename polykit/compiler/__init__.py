"""The compiler: graph IR, ONNX import/export, shape inference, passes, builder, plan format."""
