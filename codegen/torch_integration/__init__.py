"""`mi100-codegen torch`: put our AOTriton build into an installed PyTorch and take it out again."""
