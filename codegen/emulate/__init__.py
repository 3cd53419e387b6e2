"""Executing gfx9 code objects on the CPU: the pinned tinygrad AMD emulator (a dependency, found by
`source`), our per-arch layer over it, a bounded device memory (`arena.Arena`) and the `Machine`
that runs launches in a child process (`machine`). The child-only modules (`child`, `runner`,
`dispatch`, and the layer) import the emulator; nothing else here does."""
