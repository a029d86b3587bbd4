"""What runs leave behind, read back: episodes and curves for `tinkrl view`, agent runs for Docent."""
