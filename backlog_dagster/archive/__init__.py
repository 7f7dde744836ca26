"""History in files: a topic's older records archived as Kafka Connect's S3 and HDFS
sinks lay them out, for a backlog that reads files, then the log (FLIP-309's hybrid
source)."""
