"""Code that runs ON a cluster as Ray jobs (plain Python, no Django import): bandwidth probes."""
