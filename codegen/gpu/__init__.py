"""The stages that need torch and a GPU: tune, validate, report."""
