"""Real services for tests and local development: SeaweedFS S3 on loopback (local_s3)."""
