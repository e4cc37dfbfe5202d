"""Job-side runtime: process-group set-up and the CPU compatibility layer."""
