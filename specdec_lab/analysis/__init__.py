"""Cost arithmetic (roofline), the one clock and the measurements it takes (timing), and host-sync counting (syncs)."""
