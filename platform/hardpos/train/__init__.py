"""Training: the combined loss (:mod:`.loss`), the Ray Data input pipeline (:mod:`.data`),
the Ray Train loop (:mod:`.loop`) and step benchmarks (:mod:`.bench`).

Import the submodules directly; this package imports nothing heavy on its own.
"""
