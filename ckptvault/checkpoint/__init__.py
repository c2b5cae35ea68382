"""What a checkpoint is, before any store holds it: its manifest (the files, sizes and checksums of one
save), the local files discovery found, and the names of the layouts the config may choose."""
