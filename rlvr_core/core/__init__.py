"""Plain helpers every layer uses: settings, registries, statistics, seeds, progress lines, hashes (manifest), pass@k, SVG plots. Imports nothing else from rlvr_core."""
