"""What each phase does and when: boundary markers, the backlog and realtime runs, the
Spark transform, the watermark and its lag, the switching policy, progress and ETA."""
