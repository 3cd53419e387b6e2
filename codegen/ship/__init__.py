"""What travels and what arrives: drop-in bundles (the runtime built against a HIP major's headers
in a private sysroot, its kernel images and a manifest; checked on a CPU by link identity and an
emulated dispatch through a stub HIP runtime), and the torch side (install a bundle or a build
into an installed PyTorch, status, restore, the rebuild recipe)."""
