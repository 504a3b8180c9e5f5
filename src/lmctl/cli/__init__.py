"""The command-line layer: flags and wiring only; validated configs cross into the engine."""
