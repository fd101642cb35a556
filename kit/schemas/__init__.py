"""JSON Schema 2020-12 documents, one file per schema id: ``<name>.v<N>.json``."""
