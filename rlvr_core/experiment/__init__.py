"""What an experiment is: its validated config, the benchmark specs, and the training-health guards (whose
thresholds are part of the config)."""
