"""FDO: COO limits, statistics clients, limits carried to other device counts."""
