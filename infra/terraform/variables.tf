variable "bucket_name" {
  description = "The checkpoint bucket ([store] bucket in ckptvault.toml)."
  type        = string
}

variable "prefix" {
  description = "ckptvault's key prefix ([store] prefix), without slashes; \"\" for the whole bucket. The worker may touch objects under it only."
  type        = string
  default     = ""
  validation {
    condition     = !startswith(var.prefix, "/") && !endswith(var.prefix, "/") && !strcontains(var.prefix, "*")
    error_message = "prefix: no leading or trailing slash, no wildcard (e.g. \"prod\")."
  }
}

variable "partition" {
  description = "The AWS partition of the ARNs: aws, aws-cn or aws-us-gov."
  type        = string
  default     = "aws"
}

variable "sse_kms_key_arn" {
  description = "Default encryption with this KMS key (SSE-KMS, with an S3 Bucket Key); null for SSE-S3 (AES256). With a key, set [store] sse = \"aws:kms\" and sse_kms_key_id to it, and the worker policy gains kms:GenerateDataKey and kms:Decrypt on it."
  type        = string
  default     = null
  validation {
    condition     = var.sse_kms_key_arn == null || can(regex("^arn:[a-z-]+:kms:", var.sse_kms_key_arn))
    error_message = "sse_kms_key_arn must be a KMS key ARN (arn:aws:kms:REGION:ACCOUNT:key/ID) or null."
  }
}

variable "abort_incomplete_multipart_days" {
  description = "Abort multipart uploads left incomplete (a crashed ingest) after this many days. The rule has the ID ckptvault-abort-incomplete-mpu-<prefix> (without a prefix: ckptvault-abort-incomplete-mpu), the one the ingest flow checks for, so the flow finds it in place and does not rewrite the lifecycle configuration."
  type        = number
  default     = 1
}

variable "noncurrent_version_expiration_days" {
  description = "With versioning on, a deleted or overwritten object stays as a noncurrent version, billed, until this many days have passed. null keeps them forever."
  type        = number
  default     = 30
}

variable "enable_tier_lifecycle" {
  description = "Declare the tier transition rules (objects tagged ckptvault-tier=<tier> move to that tier's class) here rather than letting `tier` install them ([policy] apply_mode = \"server\" or \"both\"). Same rule IDs as the flow's (ckptvault-tier-<tier>-<prefix>)."
  type        = bool
  default     = false
}

variable "tier_transitions" {
  description = "Tier name -> storage class and age in days for the tag-driven rules. AWS needs at least 30 days before STANDARD_IA / ONEZONE_IA; the tag is only set when the policy says the checkpoint is due, so the age here is a floor, not the schedule."
  type = map(object({
    storage_class = string
    days          = number
  }))
  default = {
    warm    = { storage_class = "STANDARD_IA", days = 30 }
    cold    = { storage_class = "GLACIER", days = 1 }
    archive = { storage_class = "DEEP_ARCHIVE", days = 1 }
  }
  validation {
    condition = alltrue([
      for t in values(var.tier_transitions) :
      !contains(["STANDARD_IA", "ONEZONE_IA"], t.storage_class) || t.days >= 30
    ])
    error_message = "S3 refuses transitions to STANDARD_IA or ONEZONE_IA before 30 days."
  }
}

variable "worker_role_name" {
  description = "Attach the worker policy (the tier role: the only one that deletes checkpoints) to this existing IAM role (e.g. the IRSA role of the Kubernetes worker's service account); null to attach it yourself."
  type        = string
  default     = null
}

variable "ingest_role_name" {
  description = "Attach the ingest policy (no delete of checkpoints) to this existing IAM role, the one ingest, drills, restore and the watch run under; null to attach it yourself."
  type        = string
  default     = null
}

variable "force_destroy" {
  description = "Let `terraform destroy` delete a non-empty bucket (all checkpoints). Keep false outside tests."
  type        = bool
  default     = false
}

variable "tags" {
  description = "Tags on the bucket and the policy."
  type        = map(string)
  default     = {}
}

variable "replica_bucket_name" {
  description = "Make a replica bucket ([[replicas]] bucket, docs/replicas.md) and the policy of the credentials it is reached with (replica_policy_arn); null: no replica."
  type        = string
  default     = null
}

variable "replica_prefix" {
  description = "The replica's key prefix ([[replicas]] prefix), without slashes; \"\" for the whole bucket."
  type        = string
  default     = ""
  validation {
    condition     = !startswith(var.replica_prefix, "/") && !endswith(var.replica_prefix, "/") && !strcontains(var.replica_prefix, "*")
    error_message = "replica_prefix: no leading or trailing slash, no wildcard (e.g. \"dr\")."
  }
}

variable "replica_region" {
  description = "The replica bucket's region (another region than the primary's is the point); null: the provider's default."
  type        = string
  default     = null
}

variable "replica_aws_profile" {
  description = "The AWS credentials profile Terraform makes the replica bucket with (another account); null: the default credentials."
  type        = string
  default     = null
}

variable "replica_object_lock" {
  description = "Make the replica bucket with Object Lock, for a config with [lock] (each copy is locked as its save); the replica policy then also grants s3:PutObjectRetention and s3:PutObjectLegalHold."
  type        = bool
  default     = false
}

variable "replica_role_name" {
  description = "Attach the replica policy to this existing IAM role, the one the replica's `profile` resolves to on the workers; null to attach it yourself."
  type        = string
  default     = null
}
