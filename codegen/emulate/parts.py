"""The parts of our layer over the emulator, by name: `Machine(without=...)` leaves the named ones
out, which only the tests that show each part matters do (codegen.emulate.gfx9 holds the fixes,
codegen.emulate.guard the bounds)."""

FIXES = ("mfma", "true16", "dpp", "pc", "ds_swizzle", "denorm")
PARTS = ("guard", *FIXES)
