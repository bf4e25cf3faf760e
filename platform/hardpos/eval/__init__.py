"""Evaluation: the paper's REPLACE/SWAP benchmarks, SugarCrepe, synthetic and custom
triplet benchmarks (the paper's exact metrics), and zero-shot retention."""
