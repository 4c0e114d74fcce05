"""Generated documents: README tables and numbers (readme, docnumbers), the HTML catalogue from
templates/catalogue (catalogue), the systems' resource limits (limits) and `mlsys-flows generate`."""
