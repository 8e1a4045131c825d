"""Plain helpers every layer uses: settings (paths, environment), registries, statistics, pass@k, seeds,
progress lines, hashes and package versions (manifest), SVG plots. Imports nothing else from rlvr_core."""
