"""Where results and large payloads live: a directory or an S3 bucket."""
