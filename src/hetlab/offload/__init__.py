"""Phase B: the frozen visual encoder's prefix exported, quantised and run on an inference accelerator."""
