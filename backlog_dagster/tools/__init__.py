"""What runs beside pipelines rather than in them: the demo behind ``make demo``, a
``dagster dev`` launcher, the reference workload and its producers, copying the log to
Kafka or to an archive, and a sample run that prepares a JVM."""
