"""Hardware discovery: parsers for nvidia-smi / topo -m / ibstat output and the probe that runs them."""
