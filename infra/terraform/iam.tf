# Two policies (docs/OPERATIONS.md, "Two roles"). The worker's (the tier role): exactly the S3 actions
# ckptvault's code calls (tests/infra/test_iam_policy.py derives them from ckptvault/store/*.py and
# compares), on the bucket (bucket-level actions) and on <bucket>/<prefix>/* (object actions);
# worker-policy.json.tftpl is its S3 document. The ingest role's (ingest, drills, restore, hold/release,
# the watch): the same without s3:DeleteObject at all; the flows run under it need
# `[store] deletes = "tier-only"` in their config (docs/OPERATIONS.md); ingest-policy.json.tftpl.

locals {
  s3_policy = jsondecode(templatefile("${path.module}/worker-policy.json.tftpl", {
    bucket_arn  = local.bucket_arn
    objects_arn = "${local.bucket_arn}/${local.key_prefix}*"
    list_prefix = "${local.key_prefix}*"
  }))

  ingest_s3_policy = jsondecode(templatefile("${path.module}/ingest-policy.json.tftpl", {
    bucket_arn  = local.bucket_arn
    objects_arn = "${local.bucket_arn}/${local.key_prefix}*"
    list_prefix = "${local.key_prefix}*"
  }))

  # SSE-KMS: writing needs a data key, reading (and completing a multipart upload) needs Decrypt.
  kms_statements = local.kms ? [{
    Sid      = "UseTheBucketKmsKey"
    Effect   = "Allow"
    Action   = ["kms:Decrypt", "kms:GenerateDataKey"]
    Resource = var.sse_kms_key_arn
  }] : []

  worker_policy = jsonencode(merge(local.s3_policy, {
    Statement = concat(local.s3_policy.Statement, local.kms_statements)
  }))

  ingest_policy = jsonencode(merge(local.ingest_s3_policy, {
    Statement = concat(local.ingest_s3_policy.Statement, local.kms_statements)
  }))
}

resource "aws_iam_policy" "worker" {
  name        = "ckptvault-worker-${var.bucket_name}"
  description = "ckptvault Prefect worker: checkpoints under s3://${var.bucket_name}/${local.key_prefix}"
  policy      = local.worker_policy
  tags        = var.tags
}

resource "aws_iam_role_policy_attachment" "worker" {
  count      = var.worker_role_name == null ? 0 : 1
  role       = var.worker_role_name
  policy_arn = aws_iam_policy.worker.arn
}

resource "aws_iam_policy" "ingest" {
  name        = "ckptvault-ingest-${var.bucket_name}"
  description = "ckptvault ingest, drills, restore and watch: s3://${var.bucket_name}/${local.key_prefix}, no delete (needs [store] deletes = tier-only)"
  policy      = local.ingest_policy
  tags        = var.tags
}

resource "aws_iam_role_policy_attachment" "ingest" {
  count      = var.ingest_role_name == null ? 0 : 1
  role       = var.ingest_role_name
  policy_arn = aws_iam_policy.ingest.arn
}
