"""How the work of moving bytes is spread and shown, the same for ingest and restore: the Submitter
that runs a protocol's steps, the ranges a big file splits into, the node that holds each node-local
file, and the progress bar."""
