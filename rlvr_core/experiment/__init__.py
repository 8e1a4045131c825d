"""What an experiment is: its validated config, the benchmark specs, and the training-health guards (their thresholds are config)."""
