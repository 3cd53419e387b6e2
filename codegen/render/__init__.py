"""Spec -> overlay: the pure plan (`overlay`: Jinja lives here and only here), the inputs it is
rendered from (`inputs`: the spec, measured rows, the compile report), where a user's spec and
results live (`workspace`), and writing or diffing the committed overlay folder (`overlay_dir`).
Importing the package loads none of them (revert and status never load Jinja)."""
