"""`mi100-codegen report`: what a card owner sends back, in one Markdown file (docs/real-cards.md)."""
