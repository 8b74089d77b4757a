"""Synthetic click data with a planted click model (`python -m sparsepipe.data.synthetic`)."""
