# The replica bucket ([[replicas]], docs/replicas.md) and the policy of the credentials it is reached
# with (the replica's `profile`): made only with replica_bucket_name set. In its own provider
# configuration (replica_region, replica_aws_profile): a copy in another region, or another account,
# is the point of a replica. The policy (replica-policy.json.tftpl, checked by
# tests/infra/test_iam_policy.py): what the replicate pass, scrub and its repair, and a restore or drill
# reading this copy send to it, on the replica's prefix only, and no delete at all (deletes never
# travel to a replica) nor a lifecycle write (an expiration rule would delete as surely). With
# replica_object_lock the bucket has Object Lock and the policy gains s3:PutObjectRetention and s3:PutObjectLegalHold (each copy locked as its save, [lock]; a held save
# held there too). The primary side of replicate needs nothing new: it reads the save and records the
# `replicated` event with the ingest role (ingest_policy_arn).

provider "aws" {
  alias   = "replica"
  region  = coalesce(var.replica_region, var.region)
  profile = var.replica_aws_profile
}

locals {
  replica        = var.replica_bucket_name != null
  replica_bucket = coalesce(var.replica_bucket_name, "none")
  replica_arn    = "arn:${var.partition}:s3:::${local.replica_bucket}"
  replica_keys   = var.replica_prefix == "" ? "" : "${var.replica_prefix}/"

  replica_s3_policy = jsondecode(templatefile("${path.module}/replica-policy.json.tftpl", {
    bucket_arn  = local.replica_arn
    objects_arn = "${local.replica_arn}/${local.replica_keys}*"
    list_prefix = "${local.replica_keys}*"
  }))

  # PutObject with a retention or a legal hold (a locked copy, a held save) needs these two as well.
  replica_lock_statements = var.replica_object_lock ? [{
    Sid      = "LockTheCopies"
    Effect   = "Allow"
    Action   = ["s3:PutObjectLegalHold", "s3:PutObjectRetention"]
    Resource = "${local.replica_arn}/${local.replica_keys}*"
  }] : []

  replica_policy = jsonencode(merge(local.replica_s3_policy, {
    Statement = concat(local.replica_s3_policy.Statement, local.replica_lock_statements)
  }))
}

resource "aws_s3_bucket" "replica" {
  # checkov:skip=CKV_AWS_18:access logs need a log bucket of the operator's choosing (or CloudTrail data events)
  # checkov:skip=CKV_AWS_144:this bucket is the cross-region copy, written by ckptvault's replicate flow
  # checkov:skip=CKV2_AWS_62:ckptvault consumes no S3 events: replicate records each copy in the primary's catalog
  # checkov:skip=CKV_AWS_145:SSE-S3; a KMS key would also need kms:GenerateDataKey/Decrypt in replica-policy.json.tftpl
  count               = local.replica ? 1 : 0
  provider            = aws.replica
  bucket              = var.replica_bucket_name
  force_destroy       = var.force_destroy
  object_lock_enabled = var.replica_object_lock
  tags                = var.tags
}

resource "aws_s3_bucket_ownership_controls" "replica" {
  count    = local.replica ? 1 : 0
  provider = aws.replica
  bucket   = aws_s3_bucket.replica[0].id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "replica" {
  count                   = local.replica ? 1 : 0
  provider                = aws.replica
  bucket                  = aws_s3_bucket.replica[0].id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "replica" {
  count    = local.replica ? 1 : 0
  provider = aws.replica
  bucket   = aws_s3_bucket.replica[0].id
  versioning_configuration {
    status = "Enabled" # Object Lock needs it; a repair's new version sits beside a locked bad one
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "replica" {
  count    = local.replica ? 1 : 0
  provider = aws.replica
  bucket   = aws_s3_bucket.replica[0].id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

data "aws_iam_policy_document" "replica_tls_only" {
  statement {
    sid     = "DenyInsecureTransport"
    effect  = "Deny"
    actions = ["s3:*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    resources = [local.replica_arn, "${local.replica_arn}/*"]
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "replica" {
  count      = local.replica ? 1 : 0
  provider   = aws.replica
  bucket     = aws_s3_bucket.replica[0].id
  policy     = data.aws_iam_policy_document.replica_tls_only.json
  depends_on = [aws_s3_bucket_public_access_block.replica]
}

# Every rule of the replica bucket is installed here: its credentials (replica-policy.json.tftpl) cannot
# write the lifecycle, and its [[replicas]] entry says lifecycle = "external". The replicate pass aborts a
# killed pass's uploads itself after six hours; the abort rule catches the rest.
# Noncurrent versions (a repair's replaced object) expire as on the primary; a locked one only once its
# retention has ended.
resource "aws_s3_bucket_lifecycle_configuration" "replica" {
  # checkov:skip=CKV_AWS_300:the abort rule below is limited to replica_prefix, as the primary's is to its prefix
  count    = local.replica ? 1 : 0
  provider = aws.replica
  bucket   = aws_s3_bucket.replica[0].id

  rule {
    id     = "ckptvault-abort-incomplete-mpu${var.replica_prefix == "" ? "" : "-${var.replica_prefix}"}"
    status = "Enabled"
    filter {
      prefix = local.replica_keys
    }
    abort_incomplete_multipart_upload {
      days_after_initiation = var.abort_incomplete_multipart_days
    }
  }

  dynamic "rule" {
    for_each = var.noncurrent_version_expiration_days == null ? [] : [var.noncurrent_version_expiration_days]
    content {
      id     = "ckptvault-noncurrent-versions"
      status = "Enabled"
      filter {
        prefix = local.replica_keys
      }
      noncurrent_version_expiration {
        noncurrent_days = rule.value
      }
    }
  }

  # The replica's own retention ([[replicas]] expire_after_days): the rule replicate installs itself with
  # lifecycle = "managed" (ckptvault/replication/retention.py retention_rule), same ID and content, so a
  # pass with lifecycle = "external" finds it. Its credentials cannot write the lifecycle: only here.
  dynamic "rule" {
    for_each = var.replica_expire_after_days == null ? [] : [var.replica_expire_after_days]
    content {
      id     = "ckptvault-replica-expire${var.replica_prefix == "" ? "" : "-${var.replica_prefix}"}"
      status = "Enabled"
      filter {
        prefix = local.replica_keys
      }
      expiration {
        days = rule.value
      }
      noncurrent_version_expiration {
        noncurrent_days = 1
      }
    }
  }

  depends_on = [aws_s3_bucket_versioning.replica]
}

# IAM is global: the policy is made with the primary's provider, for the role the replica's profile
# resolves to (in another account: make it there, from replica_policy_json).
resource "aws_iam_policy" "replica" {
  count       = local.replica ? 1 : 0
  name        = "ckptvault-replica-${local.replica_bucket}"
  description = "ckptvault replicate, scrub, restore of the copy in s3://${local.replica_bucket}/${local.replica_keys}: no delete"
  policy      = local.replica_policy
  tags        = var.tags
}

resource "aws_iam_role_policy_attachment" "replica" {
  count      = local.replica && var.replica_role_name != null ? 1 : 0
  role       = var.replica_role_name
  policy_arn = aws_iam_policy.replica[0].arn
}
