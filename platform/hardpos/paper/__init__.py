"""The paper's tables and findings, reproduced on this platform's runs.

* :mod:`hardpos.paper.table1`  the demo's results in the paper's Table-1 layout;
* :mod:`hardpos.paper.table3`  the comparison of tracked runs in the paper's Table-3 layout;
* :mod:`hardpos.paper.figures` the paper's own numbers and the mean ± std over seeds;
* :mod:`hardpos.paper.confirm` the preregistered checks (``checks.json``: the paper's findings in
  its own words), judged over worlds with Holm's correction, and one run set against them.
"""
