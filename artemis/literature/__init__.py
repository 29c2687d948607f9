"""Literature harvesting (PubMed, Crossref) driven by the provenance registry."""
