"""Where the blocks' documentation lives (each block's ``_documentation_url`` adds its anchor)."""

# docs/blocks.md of this repository, as published with the project's sources
DOCS_URL = "https://github.com/mlsys-flows/mlsys-flows/blob/main/docs/blocks.md"
