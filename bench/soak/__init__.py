"""`bench soak`: hours of mixed load and faults through the gateway, every process watched, and its report."""
