"""Integration tests: real S3 servers (SeaweedFS, Ceph RGW, moto) over HTTP, started by tests/conftest.py."""
