"""The bench harness (CleanRL's one small benchmark utility, in a few modules): common flags
(:mod:`.flags`), result files with provenance (:mod:`.results`), plot saving (:mod:`.plots`), sim
sites on leased ports (:mod:`.sites`), `vla rl` session jobs and sim workers (:mod:`.jobs`), the
statistics (:mod:`.stats`), and the README's headline table read from the results (:mod:`.headline`).
A bench script imports these and the product packages, never another script (bench/tests/test_layout.py)."""
