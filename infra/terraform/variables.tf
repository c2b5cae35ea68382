variable "region" {
  description = "The AWS region of the checkpoint bucket and the IAM resources' provider ([store] region)."
  type        = string
}

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
  description = "With versioning on, a deleted or overwritten object stays as a noncurrent version, billed, until this many days have passed: the window in which a deleted or overwritten catalog can be read back as it was. With Object Lock, never fewer than object_lock_days (the larger is used). null keeps them forever."
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

variable "recover_role_name" {
  description = "Attach the recover (break-glass) policy to this existing IAM role, the one an on-call human assumes for `ckptvault recover --apply` only; null to attach it yourself or to use break_glass_principal_arns."
  type        = string
  default     = null
}

variable "break_glass_principal_arns" {
  description = "Who may assume the break-glass role <role_name_prefix>-break-glass (the recover policy: `ckptvault recover --since TIME --apply`): the on-call's IAM users or roles (arn:aws:iam::ACCOUNT:user/NAME, role/NAME), or arn:aws:iam::ACCOUNT:root to let that account's own policies decide. Empty: no role is made. Never a flow's role."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for a in var.break_glass_principal_arns : can(regex("^arn:[a-z-]+:iam::[0-9]{12}:(root|user/.+|role/.+)$", a))])
    error_message = "break_glass_principal_arns: IAM ARNs of users, roles or an account root (arn:aws:iam::ACCOUNT:role/NAME)."
  }
}

variable "break_glass_require_mfa" {
  description = "Assuming the break-glass role needs MFA (aws:MultiFactorAuthPresent, within the last hour). Turn off only where the principals are federated roles whose identity provider enforces MFA (an assumed-role session carries no MFA key)."
  type        = bool
  default     = true
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
  description = "The replica bucket's region (another region than the primary's is the point); null: region."
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

variable "replica_expire_after_days" {
  description = "The replica's own retention: its [[replicas]] expire_after_days (set the same number there). Installs the rule ckptvault-replica-expire-<replica_prefix> that replicate would install itself with lifecycle = \"managed\": objects under the prefix expire this many days after their copy, their noncurrent versions a day later (once any lock has passed). null: kept until removed by hand."
  type        = number
  default     = null
  validation {
    condition     = var.replica_expire_after_days == null || try(var.replica_expire_after_days >= 1 && var.replica_expire_after_days <= 36500, false)
    error_message = "replica_expire_after_days: 1 to 36500 days, as [[replicas]] expire_after_days, or null."
  }
}

variable "replica_role_name" {
  description = "Attach the replica policy to this existing IAM role, the one the replica's `profile` resolves to on the workers; null to attach it yourself."
  type        = string
  default     = null
}

variable "object_lock_mode" {
  description = "S3 Object Lock on the checkpoint bucket, the [lock] mode of ckptvault.toml: \"governance\" or \"compliance\" make the bucket with Object Lock (only at creation: changing it on an existing bucket replaces the bucket, so set it before the first apply); \"off\": none. ckptvault locks each save itself ([lock] days); the bucket's default retention is optional (object_lock_default_retention)."
  type        = string
  default     = "off"
  validation {
    condition     = contains(["off", "governance", "compliance"], var.object_lock_mode)
    error_message = "object_lock_mode: \"off\", \"governance\" or \"compliance\", spelt as [lock] mode."
  }
}

variable "object_lock_days" {
  description = "[lock] days: how long ckptvault locks each committed save; also the bucket's default retention with object_lock_default_retention. 0: no lock at upload."
  type        = number
  default     = 0
  validation {
    condition     = var.object_lock_days >= 0 && var.object_lock_days <= 36500 && floor(var.object_lock_days) == var.object_lock_days
    error_message = "object_lock_days: a whole number of days, 0 to 36500, as [lock] days."
  }
}

variable "object_lock_default_retention" {
  description = "Also give the bucket a default retention (object_lock_mode for object_lock_days): every object written without one is locked, the catalog, the alert state and the probes' objects included, so tier's compaction leaves locked noncurrent versions behind until the date. Off: only the saves ckptvault locks are locked."
  type        = bool
  default     = false
}

variable "oidc_provider_arn" {
  description = "The IAM OIDC provider of the EKS cluster (arn:aws:iam::ACCOUNT:oidc-provider/oidc.eks.REGION.amazonaws.com/id/ID; `aws iam list-open-id-connect-providers`). Set: the roles <role_name_prefix>-ingest and <role_name_prefix>-tier are made, each trusted by the Kubernetes service account of the same fixed name (ckptvault-ingest, ckptvault-tier) in k8s_namespace only (IRSA), with the ingest and worker policies attached. null: no roles (attach the policies with ingest_role_name / worker_role_name)."
  type        = string
  default     = null
  validation {
    condition     = var.oidc_provider_arn == null || can(regex("^arn:[a-z-]+:iam::[0-9]{12}:oidc-provider/[^/]+/.+$", var.oidc_provider_arn))
    error_message = "oidc_provider_arn: arn:aws:iam::ACCOUNT:oidc-provider/oidc.eks.REGION.amazonaws.com/id/ID, or null."
  }
}

variable "k8s_namespace" {
  description = "The Kubernetes namespace of the two service accounts the roles trust (infra/k8s)."
  type        = string
  default     = "ckptvault"
}

variable "role_name_prefix" {
  description = "The IRSA roles are <role_name_prefix>-ingest and <role_name_prefix>-tier (IAM role names are unique per account: change it for a second deployment). The service accounts keep their names."
  type        = string
  default     = "ckptvault"
}
