output "bucket" {
  description = "[store] bucket"
  value       = aws_s3_bucket.checkpoints.id
}

output "bucket_arn" {
  value = aws_s3_bucket.checkpoints.arn
}

output "worker_policy_arn" {
  description = "Attach to the role that runs tier (IRSA) or user: the only one that may delete checkpoints."
  value       = aws_iam_policy.worker.arn
}

output "worker_policy_json" {
  value = local.worker_policy
}

output "ingest_policy_arn" {
  description = "Attach to the role that runs ingest, drills, restore and the watch: it cannot delete a checkpoint."
  value       = aws_iam_policy.ingest.arn
}

output "ingest_policy_json" {
  value = local.ingest_policy
}

output "recover_policy_arn" {
  description = "The break-glass policy (`ckptvault recover --since TIME --apply`): attach it to a role only an on-call human assumes, for a recovery only (docs/OPERATIONS.md); never to a flow's."
  value       = aws_iam_policy.recover.arn
}

output "recover_policy_json" {
  value = local.recover_policy
}

output "break_glass_role_arn" {
  description = "The role <role_name_prefix>-break-glass with the recover policy, assumable by break_glass_principal_arns (with MFA); null without them."
  value       = local.break_glass ? aws_iam_role.break_glass[0].arn : null
}

output "store_config" {
  description = "The [store] section for ckptvault.toml (credentials come from the role, never from the file); with Object Lock, the [lock] section that matches the bucket."
  value = join("\n", compact([
    "[store]",
    "bucket = \"${var.bucket_name}\"",
    var.prefix == "" ? "" : "prefix = \"${var.prefix}\"",
    "region = \"${var.region}\"",
    local.kms ? "sse = \"aws:kms\"" : "",
    local.kms ? "sse_kms_key_id = \"${var.sse_kms_key_arn}\"" : "",
    "deletes = \"tier-only\"",  # the ingest role cannot delete
    "lifecycle = \"external\"", # nor write the lifecycle: every rule is main.tf's
    local.object_lock ? "\n[lock]\nmode = \"${var.object_lock_mode}\"\ndays = ${var.object_lock_days}" : "",
  ]))
}

output "ingest_role_arn" {
  description = "The IRSA role of the service account ckptvault-ingest (annotate it with eks.amazonaws.com/role-arn); null without oidc_provider_arn."
  value       = local.irsa ? aws_iam_role.irsa["ingest"].arn : null
}

output "tier_role_arn" {
  description = "The IRSA role of the service account ckptvault-tier, the only one that may delete; null without oidc_provider_arn."
  value       = local.irsa ? aws_iam_role.irsa["tier"].arn : null
}

output "replica_policy_arn" {
  description = "Attach to the role the replica's `profile` resolves to: replicate, scrub and restore reach the copy with it; it cannot delete."
  value       = local.replica ? aws_iam_policy.replica[0].arn : null
}

output "replica_policy_json" {
  value = local.replica ? local.replica_policy : null
}

output "replica_config" {
  description = "The [[replicas]] entry for ckptvault.toml (name it, and set its profile to the credentials with replica_policy_arn)."
  value = local.replica ? join("\n", compact([
    "[[replicas]]",
    "name = \"${var.replica_bucket_name}\"",
    "bucket = \"${var.replica_bucket_name}\"",
    var.replica_prefix == "" ? "" : "prefix = \"${var.replica_prefix}\"",
    "region = \"${coalesce(var.replica_region, var.region)}\"",
    "profile = \"replica\"",
    "lifecycle = \"external\"", # its rules are replica.tf's; its credentials cannot write them
    var.replica_expire_after_days == null ? "" : "expire_after_days = ${var.replica_expire_after_days}",
  ])) : null
}
