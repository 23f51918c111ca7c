"""`bench calibrate`: sweeps, the knee, the capacity formula, the compute-model fit and the calibration report."""
