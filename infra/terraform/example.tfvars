bucket_name = "acme-ckptvault-checkpoints"
prefix      = "prod"
# sse_kms_key_arn    = "arn:aws:kms:us-east-1:123456789012:key/00000000-0000-0000-0000-000000000000"
# worker_role_name   = "ckptvault-worker"   # the IRSA role of infra/k8s's service account
# enable_tier_lifecycle = true               # with [policy] apply_mode = "server" or "both"
