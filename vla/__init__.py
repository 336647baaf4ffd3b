"""VLA backbones behind one interface, and the `vla` command line (vla.cli).

Importing ``vla`` is cheap: backbones and torch are imported by the subcommands that need them.
"""
