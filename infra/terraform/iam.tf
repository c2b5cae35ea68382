# Two policies (docs/OPERATIONS.md, "Two roles"), and a third for the break-glass role (below). The worker's (the tier role): exactly the S3 actions
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

  # The break-glass role's (`recover --since TIME --apply`, docs/OPERATIONS.md "The break-glass role"):
  # removes delete markers by version id and puts a save's overwritten objects back, locked as they were;
  # no plain delete, no bypass, no lifecycle write. recover-policy.json.tftpl.
  recover_s3_policy = jsondecode(templatefile("${path.module}/recover-policy.json.tftpl", {
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

  recover_policy = jsonencode(merge(local.recover_s3_policy, {
    Statement = concat(local.recover_s3_policy.Statement, local.kms_statements)
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

# The two roles on EKS (IRSA): each trusted by one Kubernetes service account only, the name infra/k8s gives
# it, so a pod of the namespace under another account cannot take either role. The ingest role gets the
# policy without deletes or lifecycle writes, the tier role the worker policy (the only one that may delete).
locals {
  irsa             = var.oidc_provider_arn != null
  oidc_issuer      = local.irsa ? regex("oidc-provider/(.+)$", var.oidc_provider_arn)[0] : ""
  service_accounts = { ingest = "ckptvault-ingest", tier = "ckptvault-tier" }
  role_policies    = { ingest = aws_iam_policy.ingest.arn, tier = aws_iam_policy.worker.arn }

  # Built here, not with aws_iam_policy_document: the document is then known at plan time, and the tests
  # (tests/roles.tftest.hcl, with a mock provider) can read it.
  irsa_trust = {
    for role, account in local.service_accounts : role => jsonencode({
      Version = "2012-10-17"
      Statement = [{
        Sid       = "OnlyTheServiceAccount${title(role)}"
        Effect    = "Allow"
        Principal = { Federated = var.oidc_provider_arn }
        Action    = "sts:AssumeRoleWithWebIdentity"
        Condition = {
          StringEquals = {
            "${local.oidc_issuer}:sub" = "system:serviceaccount:${var.k8s_namespace}:${account}"
            "${local.oidc_issuer}:aud" = "sts.amazonaws.com"
          }
        }
      }]
    })
  }
}

resource "aws_iam_role" "irsa" {
  for_each             = local.irsa ? local.service_accounts : {}
  name                 = "${var.role_name_prefix}-${each.key}"
  description          = "ckptvault ${each.key} role, for the service account ${var.k8s_namespace}/${each.value} (IRSA)"
  assume_role_policy   = local.irsa_trust[each.key]
  max_session_duration = 3600
  tags                 = var.tags
}

resource "aws_iam_role_policy_attachment" "irsa" {
  for_each   = aws_iam_role.irsa
  role       = each.value.name
  policy_arn = local.role_policies[each.key]
}

# The break-glass role (docs/OPERATIONS.md, "The break-glass role"): `ckptvault recover --since TIME --apply`
# after an attack, and nothing else. Not a flow's: neither service account can take it. Made only when
# break_glass_principal_arns names who may (the on-call's IAM users or roles, or an account's root to leave
# the choice to that account's own policies), and with MFA unless break_glass_require_mfa is false.
locals {
  break_glass = length(var.break_glass_principal_arns) > 0
  break_glass_trust = jsonencode({
    Version = "2012-10-17"
    Statement = [merge({
      Sid       = "OnCallOnly"
      Effect    = "Allow"
      Principal = { AWS = var.break_glass_principal_arns }
      Action    = "sts:AssumeRole"
      }, var.break_glass_require_mfa ? {
      Condition = {
        Bool            = { "aws:MultiFactorAuthPresent" = "true" }
        NumericLessThan = { "aws:MultiFactorAuthAge" = "3600" }
      }
    } : {})]
  })
}

resource "aws_iam_policy" "recover" {
  name        = "ckptvault-recover-${var.bucket_name}"
  description = "ckptvault recover --apply (break-glass): remove delete markers and put saves back under s3://${var.bucket_name}/${local.key_prefix}; no plain delete"
  policy      = local.recover_policy
  tags        = var.tags
}

resource "aws_iam_role_policy_attachment" "recover" {
  count      = var.recover_role_name == null ? 0 : 1
  role       = var.recover_role_name
  policy_arn = aws_iam_policy.recover.arn
}

resource "aws_iam_role" "break_glass" {
  count                = local.break_glass ? 1 : 0
  name                 = "${var.role_name_prefix}-break-glass"
  description          = "ckptvault recover --apply after an attack: assumed by the on-call, with MFA, for the recovery only"
  assume_role_policy   = local.break_glass_trust
  max_session_duration = 3600
  tags                 = var.tags
}

resource "aws_iam_role_policy_attachment" "break_glass" {
  count      = local.break_glass ? 1 : 0
  role       = aws_iam_role.break_glass[0].name
  policy_arn = aws_iam_policy.recover.arn
}
