"""The paper's tables and findings, reproduced on this platform's runs.

* :mod:`hardpos.paper.table1` the demo's results in the paper's Table-1 layout;
* :mod:`hardpos.paper.table3` the comparison of tracked runs in the paper's Table-3 layout;
* :mod:`hardpos.paper.signs`  the paper's own numbers, whether a run shows its findings
  (paired tests over seeds, noise floors for one run) and the mean ± std over seeds.
"""
