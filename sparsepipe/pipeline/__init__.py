"""Everything that runs on devices: sharded embeddings, the pipelined step, ZeRO."""
