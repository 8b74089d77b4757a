"""Job configs: fields and defaults, config -> specs, features from a manifest, shipped configs."""
