"""Environment variables upstream's build reads (the same in every supported release). Stages
that set or edit them name them from here."""

from __future__ import annotations

HEAD_DIMS_ENV = "AOTRITON_FLASH_BLOCK_DMODEL"  # head dims the flash rules build ('16, 32, 64')
ENABLE_FP32_ENV = "AOTRITON_ENABLE_FP32"       # CMake option passed to the generator (default ON)
COMMIT_ENV = "AOTRITON_CI_SUPPLIED_SHA1"       # the commit, for a tree without .git (0.11b+)
TREE_SHA_ENV = "AOTRITON_GIT_TREESHA1"         # the commit's tree id, likewise (0.12b+)
