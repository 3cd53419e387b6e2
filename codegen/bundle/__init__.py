"""Drop-in bundles: an AOTriton runtime built against a HIP major's headers (a private sysroot),
its kernel images, and a manifest; checked on a CPU (link identity, emulated dispatch through a
stub HIP runtime) before `torch install --bundle` puts it into an official ROCm wheel."""
