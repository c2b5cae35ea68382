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

output "store_config" {
  description = "The [store] section for ckptvault.toml (credentials come from the role, never from the file)."
  value = join("\n", compact([
    "[store]",
    "bucket = \"${var.bucket_name}\"",
    var.prefix == "" ? "" : "prefix = \"${var.prefix}\"",
    local.kms ? "sse = \"aws:kms\"" : "",
    local.kms ? "sse_kms_key_id = \"${var.sse_kms_key_arn}\"" : "",
  ]))
}
