"""Looking at and editing ONNX models with polykit's compiler: sanitize and subgraph extraction
(`polykit surgeon`), what runs on a target (capability) and what each tensor-parallel rank holds (ranks)."""
