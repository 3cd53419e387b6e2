"""`mi100-codegen tune`: measure the spec's kernel configs on a GPU, record winners as reviewable CSV."""
