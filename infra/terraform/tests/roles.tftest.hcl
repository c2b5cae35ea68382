# `terraform test` with Terraform's own mock providers: no AWS account, no credentials, no network (the
# provider's schema comes from the local mirror; tests/infra/test_terraform_test.py runs it). What it proves:
# the plan of the example and of a variant with Object Lock, a replica and KMS, the two roles' trust and
# policies, and the variables' checks. What it cannot: that AWS accepts the documents (see README.md).

# A mocked data source returns random strings; the provider's own check wants a policy to be JSON.
mock_provider "aws" {
  mock_data "aws_iam_policy_document" {
    defaults = { json = "{\"Version\":\"2012-10-17\",\"Statement\":[]}" }
  }
}

mock_provider "aws" {
  alias = "replica"
}

variables {
  region            = "us-east-1"
  bucket_name       = "acme-ckptvault-checkpoints"
  prefix            = "prod"
  oidc_provider_arn = "arn:aws:iam::123456789012:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE"
}

run "example" {
  command = plan

  # the two roles, each trusted by its own service account in the namespace only, through the cluster's issuer
  assert {
    condition     = aws_iam_role.irsa["ingest"].name == "ckptvault-ingest" && aws_iam_role.irsa["tier"].name == "ckptvault-tier"
    error_message = "the roles are ckptvault-ingest and ckptvault-tier"
  }
  assert {
    condition = jsondecode(aws_iam_role.irsa["ingest"].assume_role_policy).Statement[0].Condition.StringEquals == {
      "oidc.eks.us-east-1.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE:sub" = "system:serviceaccount:ckptvault:ckptvault-ingest"
      "oidc.eks.us-east-1.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE:aud" = "sts.amazonaws.com"
    }
    error_message = "the ingest role trusts exactly ckptvault/ckptvault-ingest, for STS"
  }
  assert {
    condition = jsondecode(aws_iam_role.irsa["tier"].assume_role_policy).Statement[0].Condition.StringEquals == {
      "oidc.eks.us-east-1.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE:sub" = "system:serviceaccount:ckptvault:ckptvault-tier"
      "oidc.eks.us-east-1.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE:aud" = "sts.amazonaws.com"
    }
    error_message = "the tier role trusts exactly ckptvault/ckptvault-tier, for STS"
  }
  assert {
    condition = alltrue([for r in values(aws_iam_role.irsa) : (
      length(jsondecode(r.assume_role_policy).Statement) == 1 &&
      jsondecode(r.assume_role_policy).Statement[0].Principal == { Federated = var.oidc_provider_arn } &&
      jsondecode(r.assume_role_policy).Statement[0].Action == "sts:AssumeRoleWithWebIdentity"
    )])
    error_message = "one statement per trust: web identity from the cluster's OIDC provider only"
  }
  assert {
    condition     = aws_iam_role_policy_attachment.irsa["ingest"].role == "ckptvault-ingest" && aws_iam_role_policy_attachment.irsa["tier"].role == "ckptvault-tier"
    error_message = "each role has its policy attached"
  }

  # the ingest policy: no delete, no lifecycle write, no bypass; the tier's may delete
  assert {
    condition = length(setintersection(
      toset(flatten([for st in jsondecode(aws_iam_policy.ingest.policy).Statement : st.Action])),
      ["s3:DeleteObject", "s3:DeleteObjectVersion", "s3:PutLifecycleConfiguration", "s3:BypassGovernanceRetention"]
    )) == 0
    error_message = "the ingest policy grants a delete, a lifecycle write or the bypass"
  }
  assert {
    condition     = contains(flatten([for st in jsondecode(aws_iam_policy.worker.policy).Statement : st.Action]), "s3:DeleteObject")
    error_message = "the tier (worker) policy may delete"
  }
  assert {
    condition     = aws_s3_bucket.checkpoints.object_lock_enabled == false && length(aws_s3_bucket_object_lock_configuration.checkpoints) == 0
    error_message = "no Object Lock unless asked for"
  }
  assert {
    condition     = length(aws_s3_bucket.replica) == 0 && length(aws_iam_policy.replica) == 0
    error_message = "no replica unless asked for"
  }
  # the abort rule the ingest flow would have written: Terraform installs it ([store] lifecycle = "external")
  assert {
    condition     = [for r in aws_s3_bucket_lifecycle_configuration.checkpoints.rule : r.id if length(r.abort_incomplete_multipart_upload) > 0] == ["ckptvault-abort-incomplete-mpu-prod"]
    error_message = "the abort rule of the prefix"
  }
  assert {
    condition     = strcontains(output.store_config, "lifecycle = \"external\"") && strcontains(output.store_config, "deletes = \"tier-only\"") && !strcontains(output.store_config, "[lock]")
    error_message = "store_config tells the flows who owns deletes and the lifecycle"
  }
}

run "object_lock_replica_and_kms" {
  command = plan

  variables {
    object_lock_mode              = "compliance"
    object_lock_days              = 30
    object_lock_default_retention = true
    sse_kms_key_arn               = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    replica_bucket_name           = "acme-ckptvault-dr"
    replica_prefix                = "dr"
    replica_region                = "us-west-2"
    replica_object_lock           = true
    replica_expire_after_days     = 40
  }

  assert {
    condition     = aws_s3_bucket.checkpoints.object_lock_enabled == true
    error_message = "the bucket is made with Object Lock"
  }
  assert {
    condition = (
      aws_s3_bucket_object_lock_configuration.checkpoints[0].rule[0].default_retention[0].mode == "COMPLIANCE" &&
      aws_s3_bucket_object_lock_configuration.checkpoints[0].rule[0].default_retention[0].days == 30
    )
    error_message = "the default retention is [lock]'s mode and days"
  }
  assert {
    condition     = strcontains(output.store_config, "[lock]\nmode = \"compliance\"\ndays = 30")
    error_message = "store_config carries the matching [lock]"
  }
  assert {
    condition = alltrue([for p in [aws_iam_policy.ingest.policy, aws_iam_policy.worker.policy] :
      contains([for st in jsondecode(p).Statement : st.Resource if st.Sid == "UseTheBucketKmsKey"], var.sse_kms_key_arn)
    ])
    error_message = "both roles may use the bucket's KMS key"
  }
  assert {
    condition     = aws_s3_bucket.replica[0].object_lock_enabled == true
    error_message = "the replica bucket has Object Lock"
  }
  # the replica's credentials: the lock statement, and still no delete or lifecycle write
  assert {
    condition = length(setintersection(
      toset(flatten([for st in jsondecode(aws_iam_policy.replica[0].policy).Statement : st.Action])),
      ["s3:DeleteObject", "s3:DeleteObjectVersion", "s3:PutLifecycleConfiguration", "s3:BypassGovernanceRetention"]
    )) == 0
    error_message = "the replica policy grants a delete, a lifecycle write or the bypass"
  }
  assert {
    condition     = contains(flatten([for st in jsondecode(aws_iam_policy.replica[0].policy).Statement : st.Action]), "s3:PutObjectRetention")
    error_message = "with replica_object_lock the copies can be locked"
  }
  # the retention rule replicate would have installed (ckptvault/replication/retention.py)
  assert {
    condition     = [for r in aws_s3_bucket_lifecycle_configuration.replica[0].rule : [r.expiration[0].days, r.noncurrent_version_expiration[0].noncurrent_days, r.filter[0].prefix] if r.id == "ckptvault-replica-expire-dr"] == [[40, 1, "dr/"]]
    error_message = "the replica's retention rule: 40 days, noncurrent versions a day later, under dr/"
  }
  assert {
    condition     = strcontains(output.replica_config, "lifecycle = \"external\"") && strcontains(output.replica_config, "expire_after_days = 40") && strcontains(output.replica_config, "region = \"us-west-2\"")
    error_message = "replica_config matches replica.tf"
  }
}

# The recovery window: noncurrent versions (the catalog's, after an attack) outlive the saves' locks.
run "noncurrent_versions_outlive_the_lock" {
  command = plan

  variables {
    object_lock_mode = "governance"
    object_lock_days = 90
  }

  assert {
    condition     = [for r in aws_s3_bucket_lifecycle_configuration.checkpoints.rule : r.noncurrent_version_expiration[0].noncurrent_days if r.id == "ckptvault-noncurrent-versions"] == [90]
    error_message = "with [lock] days = 90 the noncurrent versions stay 90 days, not the default 30"
  }
}

run "noncurrent_versions_without_a_lock" {
  command = plan

  assert {
    condition     = [for r in aws_s3_bucket_lifecycle_configuration.checkpoints.rule : r.noncurrent_version_expiration[0].noncurrent_days if r.id == "ckptvault-noncurrent-versions"] == [30]
    error_message = "without a lock the noncurrent versions stay noncurrent_version_expiration_days (30)"
  }
}

# Computed values (the policies' ARNs) exist only after an apply; the mock provider's random strings are not
# ARNs, which the provider's check of policy_arn refuses, so each policy gets one of its own here.
run "each_role_gets_its_own_policy" {
  command = apply

  override_resource {
    target = aws_iam_policy.ingest
    values = { arn = "arn:aws:iam::123456789012:policy/ckptvault-ingest-acme-ckptvault-checkpoints" }
  }
  override_resource {
    target = aws_iam_policy.worker
    values = { arn = "arn:aws:iam::123456789012:policy/ckptvault-worker-acme-ckptvault-checkpoints" }
  }
  override_resource {
    target = aws_iam_policy.recover
    values = { arn = "arn:aws:iam::123456789012:policy/ckptvault-recover-acme-ckptvault-checkpoints" }
  }

  assert {
    condition     = aws_iam_role_policy_attachment.irsa["ingest"].policy_arn == aws_iam_policy.ingest.arn
    error_message = "the ingest role has the ingest policy"
  }
  assert {
    condition     = aws_iam_role_policy_attachment.irsa["tier"].policy_arn == aws_iam_policy.worker.arn
    error_message = "the tier role has the worker policy"
  }
  assert {
    condition     = length(toset([aws_iam_policy.ingest.arn, aws_iam_policy.worker.arn, aws_iam_policy.recover.arn])) == 3 && output.ingest_role_arn == aws_iam_role.irsa["ingest"].arn
    error_message = "three policies, and the outputs name the roles"
  }
}

run "without_a_cluster_no_roles" {
  command = plan
  variables {
    oidc_provider_arn = null
  }
  assert {
    condition     = length(aws_iam_role.irsa) == 0 && output.ingest_role_arn == null && output.tier_role_arn == null
    error_message = "no OIDC provider, no roles"
  }
}

run "a_default_retention_needs_a_mode_and_days" {
  command = plan
  variables {
    object_lock_mode              = "governance"
    object_lock_days              = 0
    object_lock_default_retention = true
  }
  expect_failures = [aws_s3_bucket.checkpoints]
}

run "lock_modes_are_spelt_as_in_the_config" {
  command = plan
  variables {
    object_lock_mode = "GOVERNANCE"
  }
  expect_failures = [var.object_lock_mode]
}

run "the_oidc_provider_is_an_arn" {
  command = plan
  variables {
    oidc_provider_arn = "https://oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE"
  }
  expect_failures = [var.oidc_provider_arn]
}

run "the_break_glass_role" {
  command = plan

  variables {
    break_glass_principal_arns = ["arn:aws:iam::123456789012:role/oncall", "arn:aws:iam::123456789012:user/alice"]
  }

  assert {
    condition     = aws_iam_role.break_glass[0].name == "ckptvault-break-glass" && aws_iam_role_policy_attachment.break_glass[0].role == "ckptvault-break-glass"
    error_message = "the break-glass role, with the recover policy attached"
  }
  assert {
    condition = jsondecode(aws_iam_role.break_glass[0].assume_role_policy).Statement == [{
      Sid       = "OnCallOnly"
      Effect    = "Allow"
      Principal = { AWS = ["arn:aws:iam::123456789012:role/oncall", "arn:aws:iam::123456789012:user/alice"] }
      Action    = "sts:AssumeRole"
      Condition = {
        Bool            = { "aws:MultiFactorAuthPresent" = "true" }
        NumericLessThan = { "aws:MultiFactorAuthAge" = "3600" }
      }
    }]
    error_message = "only the named principals, with MFA, may assume it"
  }
  # it may delete a version (a delete marker) and nothing else destructive; the flows' roles may not
  assert {
    condition = (
      contains(flatten([for st in jsondecode(aws_iam_policy.recover.policy).Statement : st.Action]), "s3:DeleteObjectVersion") &&
      length(setintersection(
        toset(flatten([for st in jsondecode(aws_iam_policy.recover.policy).Statement : st.Action])),
        ["s3:DeleteObject", "s3:BypassGovernanceRetention", "s3:PutLifecycleConfiguration"]
      )) == 0
    )
    error_message = "the recover policy removes delete markers, never deletes plainly, bypasses a lock or writes the lifecycle"
  }
  assert {
    condition = length(setintersection(
      toset(flatten([for p in [aws_iam_policy.ingest.policy, aws_iam_policy.worker.policy] : [for st in jsondecode(p).Statement : st.Action]])),
      ["s3:DeleteObjectVersion"]
    )) == 0
    error_message = "neither flow role may delete a version"
  }
  assert {
    condition     = !contains(values(local.irsa_trust), aws_iam_role.break_glass[0].assume_role_policy)
    error_message = "no service account may take the break-glass role"
  }
}

run "without_principals_no_break_glass_role" {
  command = plan
  assert {
    condition     = length(aws_iam_role.break_glass) == 0 && output.break_glass_role_arn == null && length(aws_iam_role_policy_attachment.recover) == 0
    error_message = "no principals, no break-glass role (the policy alone, to attach by hand)"
  }
}

run "break_glass_principals_are_iam_arns" {
  command = plan
  variables {
    break_glass_principal_arns = ["alice"]
  }
  expect_failures = [var.break_glass_principal_arns]
}
