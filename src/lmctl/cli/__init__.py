"""The command-line layer: flags and wiring only; validated configs cross into the engine.

May import every layer below it; only the commands' run functions import heavy ones.
"""
