"""Analysis of VIME-format runs: per-step tables, performance decomposition, statistics,
convergence tables and figures. numpy and matplotlib are imported inside functions only."""
