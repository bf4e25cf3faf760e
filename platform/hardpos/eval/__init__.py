"""Evaluation: the paper's REPLACE/SWAP benchmarks, SugarCrepe, synthetic and custom
triplet benchmarks (exact metrics of DESIGN section 5), and zero-shot retention."""
