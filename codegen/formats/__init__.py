"""One reader/writer per format we read from elsewhere or write for another program: the spec
YAML, compile lists, `.aks2` packages and image zips, the tuning database (archive and sqlite),
the op table, ELF files and code objects, the bundle zip, the tuning CSVs."""
