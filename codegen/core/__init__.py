"""The bottom layer: errors and exit codes, file writes and bounded reads, the one containment
rule, the one process runner, the one console, the package's data and cache folders, and the
checks of a command's paths before any work. Imports nothing else of codegen."""
