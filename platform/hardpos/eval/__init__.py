"""Evaluation: the paper's REPLACE/SWAP benchmarks, SugarCrepe, synthetic and custom
triplet benchmarks (the paper's exact metrics), zero-shot retention, and the evaluate
stage's files (:mod:`hardpos.eval.outputs`)."""
