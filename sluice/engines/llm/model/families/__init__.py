"""Model families: one module each (config parsing, decoder layer, weight names) and the registry."""
