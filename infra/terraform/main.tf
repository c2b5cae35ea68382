# The checkpoint bucket of ckptvault and the least-privilege policy of its Prefect worker.
# The storage format and what the flows do with the bucket: docs/FORMAT.md; see README.md here.

locals {
  bucket_arn = "arn:${var.partition}:s3:::${var.bucket_name}"
  # Keys of ckptvault: "<prefix>/<run>/step-<n>/...", "<prefix>/_catalog/...", "<prefix>/_ckptvault_probe/..."
  key_prefix  = var.prefix == "" ? "" : "${var.prefix}/"
  kms         = var.sse_kms_key_arn != null
  object_lock = var.object_lock_mode != "off"

  # The lifecycle rule IDs of ckptvault carry the prefix they cover (ckptvault/store/lifecycle.py rule_id),
  # so that stores under different prefixes of one bucket keep their own rules.
  rule_suffix       = var.prefix == "" ? "" : "-${var.prefix}"
  abort_mpu_rule_id = "ckptvault-abort-incomplete-mpu${local.rule_suffix}"

  # The recovery window (docs/object-lock.md, "The recovery window"): the catalog and _state/ are not
  # locked, so after an attack their old versions are what point-in-time reads and recovery read back;
  # they must outlive the saves' own locks, or a locked save would outlast the catalog that lists it.
  noncurrent_days = (var.noncurrent_version_expiration_days == null ? null :
  max(var.noncurrent_version_expiration_days, local.object_lock ? var.object_lock_days : 0))
}

resource "aws_s3_bucket" "checkpoints" {
  # checkov:skip=CKV_AWS_18:access logs need a log bucket of the operator's choosing (or CloudTrail data events)
  # checkov:skip=CKV_AWS_144:copies go to [[replicas]] by ckptvault's own replicate flow, which verifies each copy
  # checkov:skip=CKV2_AWS_62:ckptvault consumes no S3 events: its catalog records every save itself
  bucket        = var.bucket_name
  force_destroy = var.force_destroy
  # [lock] (docs/FORMAT.md, "Object Lock"): ckptvault refuses a [lock] config on a bucket without it, and
  # S3 enables it only when the bucket is made.
  object_lock_enabled = local.object_lock
  tags                = var.tags

  lifecycle {
    precondition {
      condition     = !var.object_lock_default_retention || (local.object_lock && var.object_lock_days >= 1)
      error_message = "object_lock_default_retention needs object_lock_mode governance or compliance and object_lock_days of 1 or more."
    }
  }
}

# Optional: the bucket's default retention. ckptvault sets each save's retention itself, so this only adds a
# floor for whatever else is written (see object_lock_default_retention).
resource "aws_s3_bucket_object_lock_configuration" "checkpoints" {
  count  = local.object_lock && var.object_lock_default_retention ? 1 : 0
  bucket = aws_s3_bucket.checkpoints.id
  rule {
    default_retention {
      mode = upper(var.object_lock_mode)
      days = var.object_lock_days
    }
  }
  depends_on = [aws_s3_bucket_versioning.checkpoints]
}

resource "aws_s3_bucket_ownership_controls" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  rule {
    object_ownership = "BucketOwnerEnforced" # ACLs off: access is IAM and bucket policy only
  }
}

resource "aws_s3_bucket_public_access_block" "checkpoints" {
  bucket                  = aws_s3_bucket.checkpoints.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "checkpoints" {
  bucket = aws_s3_bucket.checkpoints.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = local.kms ? "aws:kms" : "AES256"
      kms_master_key_id = var.sse_kms_key_arn
    }
    # One KMS data key per bucket, not per object: far fewer KMS requests for multipart uploads.
    bucket_key_enabled = local.kms
  }
}

# Refuse plain HTTP.
data "aws_iam_policy_document" "tls_only" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    resources = [local.bucket_arn, "${local.bucket_arn}/*"]
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "checkpoints" {
  bucket     = aws_s3_bucket.checkpoints.id
  policy     = data.aws_iam_policy_document.tls_only.json
  depends_on = [aws_s3_bucket_public_access_block.checkpoints]
}

# The whole lifecycle configuration of the bucket is owned here (S3 stores it as one document). The
# abort rule matches, ID and content, the one the ingest flow ensures, so the flow leaves it alone.
# `tier` in server mode merges its own ckptvault-tier-* rules into the configuration: with Terraform in
# charge, set enable_tier_lifecycle = true so they are declared here too (or the next apply drops them).
resource "aws_s3_bucket_lifecycle_configuration" "checkpoints" {
  # checkov:skip=CKV_AWS_300:the abort rule below is limited to var.prefix, so stores under other prefixes keep theirs
  bucket = aws_s3_bucket.checkpoints.id

  rule {
    id     = local.abort_mpu_rule_id
    status = "Enabled"
    filter {
      prefix = local.key_prefix
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = var.abort_incomplete_multipart_days
    }
  }

  dynamic "rule" {
    for_each = local.noncurrent_days == null ? [] : [local.noncurrent_days]
    content {
      id     = "ckptvault-noncurrent-versions"
      status = "Enabled"
      filter {
        prefix = local.key_prefix
      }
      noncurrent_version_expiration {
        noncurrent_days = rule.value
      }
      expiration {
        expired_object_delete_marker = true
      }
    }
  }

  dynamic "rule" {
    for_each = var.enable_tier_lifecycle ? var.tier_transitions : {}
    content {
      id     = "ckptvault-tier-${rule.key}${local.rule_suffix}"
      status = "Enabled"
      filter {
        and {
          prefix = local.key_prefix
          tags   = { "ckptvault-tier" = rule.key }
        }
      }
      transition {
        days          = rule.value.days
        storage_class = rule.value.storage_class
      }
    }
  }

  depends_on = [aws_s3_bucket_versioning.checkpoints]
}
