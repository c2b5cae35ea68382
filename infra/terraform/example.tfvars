region      = "us-east-1"
bucket_name = "acme-ckptvault-checkpoints"
prefix      = "prod"
# The two IRSA roles (ckptvault-ingest, ckptvault-tier) for infra/k8s's service accounts:
# oidc_provider_arn = "arn:aws:iam::123456789012:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE"
# sse_kms_key_arn    = "arn:aws:kms:us-east-1:123456789012:key/00000000-0000-0000-0000-000000000000"
# object_lock_mode   = "governance"          # [lock] mode; only when the bucket is made
# object_lock_days   = 30                    # [lock] days
# enable_tier_lifecycle = true               # with [policy] apply_mode = "server" or "both"
